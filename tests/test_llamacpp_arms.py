"""Every control arm against the real llama.cpp server, its prompt cache on and off (issue 24's "done when").

With the prompt cache on, llama.cpp evaluates a cached prompt's last token alone, so even c=1 parts
from a cold m=1: one ``bia probe --arms repeat,copies,mixed,prefix,cache,serial,prefill`` run must
put that drift on the cache. With ``--no-cache-prompt`` nothing is put on the cache, and the batched
path still differs from the single one: the copies arm keeps its divergence at c=4.

Skipped on a machine without the build, except under CI, where a missing server is a failure.
"""

from __future__ import annotations

import polars as pl
import pytest
from _cli import bia

pytest.importorskip("gguf")
pytest.importorskip("torch")

from analysis import attribution_table, read_run  # noqa: E402
from analysis.experiment import DEFAULT_PROMPTS, bundled_model  # noqa: E402
from analysis.experiment.engines import llama_server, write_gguf  # noqa: E402
from analysis.run import band_table, slot_table  # noqa: E402
from analysis.studies import prefill_table  # noqa: E402

pytestmark = pytest.mark.engine

ARMS = "repeat,copies,mixed,prefix,cache,serial,prefill"
MAX_TOKENS = 16  # small for CI: two prompts, every arm, c = 1 and 4, about a minute per cache setting on 2 cores


@pytest.fixture(scope="module", params=[True, False], ids=["cache-prompt", "no-cache-prompt"])
def probed(request, server_binary, tmp_path_factory):
    """One ``bia probe --arms ...`` of the real server per prompt-cache setting: the run and the setting."""
    folder = tmp_path_factory.mktemp("arms") / "run"
    gguf = write_gguf(bundled_model(), folder.parent / "tiny.gguf")
    prompts = folder.parent / "prompts.txt"
    prompts.write_text("\n".join(DEFAULT_PROMPTS) + "\n", encoding="utf-8")
    with llama_server(gguf, binary=server_binary, parallel=4, cache_prompt=request.param) as url:
        done = bia("probe", url, "-o", str(folder), "--prompts", str(prompts), "--ladder", "1,4", "--max-tokens", str(MAX_TOKENS),
                   "--arms", ARMS, timeout=600)
    assert done.returncode == 0, done.stderr
    return read_run(folder, cache=False), request.param


def test_every_arm_is_recorded_against_llama_cpp(probed):
    run, _ = probed
    assert run.manifest["arms"] == ARMS.split(",") and run.manifest["complete"] and run.manifest["refused"] == [] and run.missing() == []
    assert set(run.requests["arm"]) == {"reference", *ARMS.split(",")}
    assert set(band_table(run)["arm"]) == set(ARMS.split(",")) - {"prefill"}
    prefill = prefill_table(run)
    assert prefill.height == len(DEFAULT_PROMPTS) * (MAX_TOKENS - 1) and prefill["same_token"].all()
    serial = band_table(run).filter(arm="serial")
    assert (serial["m_formed"].fill_null(1) == 1).all()  # one after another: the gauge never saw two of them running


def test_alone_and_cold_llama_cpp_repeats_m1_bit_for_bit(probed):
    run, _ = probed
    repeats = slot_table(run).filter(arm="repeat")
    assert repeats.height == 2 * 3 and (repeats["bitwise_prefix"] == repeats["length"]).all()  # cache_prompt false: nothing to reuse


def test_the_prompt_cache_is_named_for_the_c1_drift_and_only_when_it_is_on(probed):
    run, cache_prompt = probed
    table = attribution_table(run)
    alone = table.filter((pl.col("arm") == "copies") & (pl.col("c") == 1))
    if cache_prompt:
        # a warm prompt evaluates its last token alone: c=1 parts from the cold m=1, and the cache arm shows it first
        assert alone.height == len(DEFAULT_PROMPTS) and set(alone["cause"]) == {"cache state"}
        assert set(alone["evidence_arm"]) == {"cache"} and (alone["evidence_part"] <= alone["bitwise_prefix"]).all()
    else:
        assert alone.height == 0  # without the cache c=1 is m=1, bit for bit
        assert "cache state" not in set(table["cause"])  # and no drift is put on the cache
        cache = slot_table(run).filter(arm="cache")
        assert (cache["bitwise_prefix"] == cache["length"]).all()
        # the batched path still differs from the single one: the copies arm keeps its divergence at c=4
        batched = table.filter((pl.col("arm") == "copies") & (pl.col("c") == 4))
        assert batched.height >= 1 and set(batched["cause"]) <= {"prefill path", "co-batching"}


def test_bia_certify_exits_non_zero_on_red_and_writes_its_certificate(probed, tmp_path):
    """The issue's CI gate: bia certify on the arms run, one row per batched arm (copies, mixed; the other arms are controls
    sent alone). With the cache on, the copies' c=1 already parts (bits) from the cold m=1: RED for the prompt cache, named
    as a request sent alone, never as a batch. Without it, nothing alone parts and the batched copies part at c=4: RED for
    what the attribution ladder names. Exit 5 either way, named in certificate.json."""
    import json

    run, cache_prompt = probed
    out = tmp_path / "certificate.json"
    done = bia("certify", str(run.path), "-o", str(out), timeout=300)
    assert done.returncode == 5, done.stdout + done.stderr
    certificate = json.loads(out.read_text())
    assert certificate["verdict"] == "RED" and certificate["exit_code"] == 5
    arms = {row["arm"]: row for row in certificate["arms"]}
    assert set(arms) == {"copies", "mixed"}
    copies = arms["copies"]
    assert copies["verdict"] == "RED"
    if cache_prompt:
        assert copies["cause"] == "prompt cache" and copies["alone_parted"] >= 1 and copies["first_request"]["c"] in (None, 1)
        assert "--no-cache-prompt" in copies["next_step"]
    else:
        # the repeats alone and cold, and the c=1 requests, are m=1 bit for bit: batching is judged, and parts at c=4
        assert copies["alone_parted"] == 0 and copies["first_request"]["c"] == 4
        assert copies["cause"] in {"prefill path", "co-batching"}
