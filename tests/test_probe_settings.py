"""ProbeSettings (issue 33): the probe's options, their defaults and their checks in one object, which probe, dry_run,
certify_server, probe_callable and bia probe share; the old keywords fold into one."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from analysis import CallableError, ProbeError, ProbeSettings, probe_callable
from analysis.probe import BATCH_LINE, dry_run, probe


def test_defaults_are_the_probes_and_sequences_are_kept_as_tuples():
    settings = ProbeSettings(prompts=["x"], ladder=[1, 2], fillers=["f"], arms=["copies"], expect={"kernel_mode": "fixed-tiles"})
    assert settings == ProbeSettings(prompts=("x",), ladder=(1, 2), fillers=("f",), arms=("copies",), expect={"kernel_mode": "fixed-tiles"})
    assert (settings.repeats, settings.max_tokens, settings.top_logprobs, settings.seed, settings.layout, settings.engine) == (1, 64, 5, 0, "copies", "auto")
    assert (settings.log_pattern, settings.metrics, settings.timeout, settings.declared_min, settings.progress) == (BATCH_LINE, True, 120.0, None, None)
    assert ProbeSettings(prompts=["x"], fillers=None).fillers == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.repeats = 2


def test_the_key_is_never_in_the_repr():
    assert "s3cret" not in repr(ProbeSettings(prompts=["x"], api_key="s3cret"))


@pytest.mark.parametrize("options, said", [
    ({"prompts": []}, "prompts must be one or more non-empty texts"),
    ({"prompts": ["x"], "ladder": [0, 4]}, "the ladder needs one or more whole numbers c of at least 1"),
    ({"prompts": ["x"], "top_logprobs": 21}, "top_logprobs must be between 0 and 20"),
    ({"prompts": ["x"], "layout": "stack"}, "layout must be 'copies', 'needle' or 'rotating'"),
    ({"prompts": ["x"], "arms": "copies"}, "arms must be a list"),
    ({"prompts": ["x"], "max_tokens": 8, "declared_min": 9}, "declared_min must be between 0 and max_tokens=8"),
    ({"prompts": ["x"], "timeout": 0}, "timeout must be a positive, finite number"),
    ({"resume": True, "timeout": -1}, "timeout must be a positive, finite number"),
])
def test_a_setting_no_run_can_be_made_of_is_refused_as_it_is_made(options, said):
    with pytest.raises(ProbeError, match=said):
        ProbeSettings(**options)


def test_a_resumed_run_keeps_its_manifests_settings_so_only_the_timeout_is_checked():
    assert ProbeSettings(resume=True).prompts == ()


def test_replace_checks_again_and_names_an_unknown_option():
    settings = ProbeSettings(prompts=["x"])
    assert settings.replace(repeats=3).repeats == 3 and settings.repeats == 1
    with pytest.raises(ProbeError, match="repeats must be at least 1"):
        settings.replace(repeats=0)
    with pytest.raises(TypeError, match="no option 'ladders'"):
        settings.replace(ladders=(1,))
    assert ProbeSettings.of(settings) is settings and ProbeSettings.of(settings, seed=4) == settings.replace(seed=4)
    assert ProbeSettings.of(None, prompts=["x"]) == settings
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        ProbeSettings.of(None, prompts=["x"], bogus=1)


def test_probe_and_dry_run_refuse_bad_keywords_before_any_request(tmp_path):
    """Nothing listens at port 9: a refusal here comes from the settings, before the probe looks for a server."""
    with pytest.raises(ProbeError, match="prompts must be"):
        asyncio.run(probe("http://127.0.0.1:9", tmp_path / "run", prompts=[]))
    with pytest.raises(ProbeError, match="declared_min"):
        asyncio.run(probe("http://127.0.0.1:9", tmp_path / "run", ProbeSettings(prompts=["x"]), max_tokens=4, declared_min=5))
    with pytest.raises(TypeError, match="'bogus'"):
        asyncio.run(probe("http://127.0.0.1:9", tmp_path / "run", prompts=["x"], bogus=1))
    with pytest.raises(ProbeError, match="top_logprobs"):
        asyncio.run(dry_run("http://127.0.0.1:9", ProbeSettings(prompts=["x"], resume=True), top_logprobs=30))  # a dry run describes a new run
    assert not (tmp_path / "run").exists()


def _generate(prompts):
    return [{"token_ids": [len(p), 7], "logprobs": [-0.5, -0.25]} for p in prompts]


def test_probe_callable_takes_the_options_it_shares_from_settings(tmp_path):
    settings = ProbeSettings(prompts=["Hello", "World"], ladder=(1, 2), layout="needle", seed=3, engine="toy", model="m")
    run = probe_callable(_generate, None, tmp_path / "a", settings=settings)
    assert run.ladder == [1, 2] and run.manifest["requested"] == {"layout": "needle"} and run.manifest["sampler"]["seed"] == 3
    assert run.manifest["identity"]["engine"] == "toy" and run.manifest["identity"]["model"] == {"path": "m"}
    run = probe_callable(_generate, ["a"], tmp_path / "b", settings=settings, layout="copies", ladder=[1, 3])  # keywords win
    assert run.ladder == [1, 3] and run.manifest["requested"] == {"layout": "copies"}
    assert probe_callable(_generate, ["a"], tmp_path / "c", settings=ProbeSettings(prompts=["x"])).manifest["identity"]["engine"] == "_generate"
    with pytest.raises(CallableError, match="prompts: expected a non-empty list"):
        probe_callable(_generate, None, tmp_path / "d")
