"""One model across engines (analysis.engine_table): streams written by hand, each comparison worked out by hand, and the
report section on the bundled torch and llama.cpp runs."""

from __future__ import annotations

import json
import re

import polars as pl
import pytest
from conftest import ROOT

from analysis import RunError, assemble_run, engine_table, read_run
from analysis.views.html import engines_html
from analysis import judge


def _chat(path, tokens: list[tuple[str, float]]):
    """A chat completion with logprobs: each (text, logprob) one token."""
    entries = [{"token": text, "bytes": list(text.encode()), "logprob": lp, "top_logprobs": [{"token": text, "bytes": list(text.encode()), "logprob": lp}]}
               for text, lp in tokens]
    path.write_text(json.dumps({"id": path.stem, "object": "chat.completion", "model": "m", "choices": [{
        "index": 0, "message": {"role": "assistant", "content": "".join(t for t, _ in tokens)}, "finish_reason": "length",
        "logprobs": {"content": entries}}], "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}}))
    return str(path)


A = [("a", -0.5), ("b", -0.25), ("c", -0.125), ("d", -1.0)]


def _engine(tmp_path, name: str, ref1, ref2, band) -> object:
    """A run of one prompt "p": two m=1 references and a band of c=2 (two requests)."""
    folder = tmp_path / name
    folder.mkdir()
    mapping = [{"source": _chat(folder / "r0.json", ref1), "prompt_id": "p", "role": "reference", "slot": 0},
               {"source": _chat(folder / "r1.json", ref2), "prompt_id": "p", "role": "reference", "slot": 1}]
    mapping += [{"source": _chat(folder / f"b{k}.json", stream), "prompt_id": "p", "role": "band", "c": 2, "slot": k}
                for k, stream in enumerate(band)]
    return assemble_run(mapping, {"ladder": [2], "prompts": [{"prompt_id": "p", "text": "x"}], "identity": {"engine": name}})


def test_engine_table_by_hand(tmp_path):
    reference = _engine(tmp_path, "ref", A, A, [A, A])  # invariant, run to run too
    # engine "other": its m=1 differs from the reference's in the bits of token 1 (-0.25 -> -0.2500001); its ref #2 agrees
    # with its ref #1; one batched request is its m=1 exactly, the other parts in tokens at token 2 ("x" for "c")
    other_m1 = [("a", -0.5), ("b", -0.2500001), ("c", -0.125), ("d", -1.0)]
    other = _engine(tmp_path, "other", other_m1, other_m1, [other_m1, [("a", -0.5), ("b", -0.2500001), ("x", -0.7), ("d", -1.0)]])
    table = engine_table([reference, other])
    assert table.select("engine", "role", "c", "requests", "token_identical", "earliest_divergence", "min_bitwise_prefix",
                        "own_m1_bit_identical").rows() == [
        ("ref (run)", "m=1", None, 1, 1, None, 4, 1.0),
        ("ref (run)", "band", 2, 2, 2, None, 4, 1.0),
        ("other (run)", "m=1", None, 1, 1, None, 1, 1.0),
        ("other (run)", "band", 2, 2, 1, 2, 1, 0.5),
    ]
    row = table.filter((pl.col("engine") == "other (run)") & (pl.col("role") == "m=1")).row(0, named=True)
    # float32(-0.2500001) is -0.25000009: three steps of 2**-25 (the spacing just past 0.25) beyond -0.25
    assert row["max_ulp"] == 3
    assert row["max_abs_delta"] == pytest.approx(1e-7, rel=1e-6)  # the logprobs as sent
    # whether each engine is batch invariant by itself is its judgement's, not the table's: other parts at c=2
    assert [judge(run).verdict for run in (reference, other)] == ["UNVERIFIED", "RED"]  # no width evidence: c=2 never seen formed


def test_engines_must_share_their_prompts(tmp_path):
    reference = _engine(tmp_path, "ref", A, A, [A, A])
    other = _engine(tmp_path, "other", A, A, [A, A])
    other.manifest["prompts"] = [{"prompt_id": "p", "text": "something else"}]
    with pytest.raises(RunError, match=r"prompt 'p' is 'something else', but .* sent 'x' under that id"):
        engine_table([reference, other])


def test_the_report_shows_engines_side_by_side_on_the_bundled_runs():
    runs = [read_run(ROOT / "data" / name) for name in ("experiment-cpu/default", "experiment-cpu/fixed-tiles", "llamacpp-cpu/no-cache-prompt")]
    page = engines_html(runs)
    text = " ".join(page.split())
    # llama.cpp serves the same weights with tanh-approximated GELU: the same tokens, other bits from the first token on
    assert ("llama.cpp server (no-cache-prompt): " in text
            and "2 of 2 token-identical; bits from token 0, up to 189,643 ULP against the reference engine (|delta logprob| up to 0.002114)" in text)
    assert "The reference engine is bia torch (analysis.experiment) (default)" in text
    # vLLM's CPU build serves the same weights from the GPT-2 checkpoint: the same tokens, other bits (up to 154 ULP from
    # token 0); its own verdict is the judgement's (UNVERIFIED: some of its batches never seen formed)
    with_vllm = " ".join(engines_html([*runs, read_run(ROOT / "data" / "vllm-cpu" / "no-prefix-cache")]).split())
    assert ("vLLM (no-prefix-cache): data/vllm-cpu/no-prefix-cache</td><td>UNVERIFIED</td><td class=\"bia-long\">2 of 2 token-identical; "
            "bits from token 0, up to 154 ULP against the reference engine") in with_vllm.replace(str(ROOT) + "/", "")
    verdicts = re.findall(r'<td class="bia-long">([^<]+): [^<]+</td><td>(\w+)</td>', with_vllm)
    assert [v for _, v in verdicts] == ["RED", "AMBER", "RED", "UNVERIFIED"]  # default, fixed-tiles, llama.cpp, vLLM: judge's
    assert [v for _, v in verdicts] == [judge(run).verdict for run in [*runs, read_run(ROOT / "data" / "vllm-cpu" / "no-prefix-cache")]]
    assert engines_html(runs[:2]) == ""  # one engine: nothing to put side by side


def test_the_engines_say_from_which_c_transformers_padded_batching_changes_bits():
    """Issue 34: the bundled transformers runs beside bia's default and fixed-tiles modes: alone (c=1) each is its own m=1 bit
    for bit; from c=4 (the ladder's first batch) none of its requests is, in padded and in continuous batching alike."""
    names = ("experiment-cpu/default", "experiment-cpu/fixed-tiles", "transformers-cpu/padded",
             "transformers-cpu/continuous")
    page = engines_html([read_run(ROOT / "data" / name) for name in names])
    rows = re.findall(r'<tr><td class="bia-long">([^<]+): [^<]+</td><td>(\w+)</td>.*?<td[^>]*>([^<]*)</td></tr>', page)
    assert [(engine.split(" (")[0], verdict, own) for engine, verdict, own in rows] == [
        ("bia torch", "RED", "100% / 0% / 0% / 0%"), ("bia torch", "AMBER", "100% / 100% / 100% / 100%"),
        ("transformers 5.24.0", "RED", "100% / 0% / 0% / 0%"), ("transformers 5.24.0", "RED", "100% / 0% / 0% / 0%")]


def _multi(tmp_path, name: str, prompts: dict, *, texts: dict | None = None):
    """A run of several prompts: each maps to (ref #1, ref #2 or None, [band c=2 streams])."""
    folder = tmp_path / name
    folder.mkdir()
    mapping = []
    for prompt, (ref1, ref2, band) in prompts.items():
        mapping.append({"source": _chat(folder / f"{prompt}-r0.json", ref1), "prompt_id": prompt, "role": "reference", "slot": 0})
        if ref2 is not None:
            mapping.append({"source": _chat(folder / f"{prompt}-r1.json", ref2), "prompt_id": prompt, "role": "reference", "slot": 1})
        mapping += [{"source": _chat(folder / f"{prompt}-b{k}.json", s), "prompt_id": prompt, "role": "band", "c": 2, "slot": k}
                    for k, s in enumerate(band)]
    texts = texts or {p: f"text of {p}" for p in prompts}
    return assemble_run(mapping, {"ladder": [2], "prompts": [{"prompt_id": p, **({"text": t} if t is not None else {})} for p, t in texts.items()],
                                  "identity": {"engine": name}})


def test_the_m1_row_by_hand_over_two_prompts(tmp_path):
    B = [("e", -0.5), ("f", -0.25), ("g", -0.125)]
    reference = _multi(tmp_path, "ref", {"p": (A, A, [A, A]), "q": (B, B, [B, B])})
    # engine "two": on p its m=1 parts from the reference's at token 1 ("z" for "b") and its ref #2 repeats its ref #1;
    # on q its m=1 is the reference's but its ref #2 differs in the last logprob's bits (run to run)
    p1 = [("a", -0.5), ("z", -3.0), ("c", -0.125), ("d", -1.0)]
    q2 = [("e", -0.5), ("f", -0.25), ("g", -0.126)]
    two = _multi(tmp_path, "two", {"p": (p1, p1, [p1, p1]), "q": (B, q2, [B, B])})
    row = engine_table([reference, two]).filter((pl.col("engine") == "two (run)") & (pl.col("role") == "m=1")).row(0, named=True)
    assert row["run"] == "assembled run"
    assert (row["requests"], row["token_identical"], row["earliest_divergence"], row["min_bitwise_prefix"]) == (2, 1, 1, 1)
    assert row["max_ulp"] == 0 and row["max_abs_delta"] == 0.0  # where they agree (p's token 0, all of q) the bits are the same
    assert row["own_m1_bit_identical"] == 0.5  # p repeats itself, q does not


def test_a_run_without_ref2_or_without_shared_prompts(tmp_path):
    reference = _multi(tmp_path, "ref", {"p": (A, A, [A, A])})
    lone = _multi(tmp_path, "lone", {"p": (A, None, [A, A])})  # no ref #2: run to run is unknown, not 0 or 1
    assert engine_table([reference, lone]).filter(pl.col("role") == "m=1")["own_m1_bit_identical"].to_list() == [1.0, None]
    other = _multi(tmp_path, "other", {"q": (A, A, [])})  # another prompt id, no band: nothing to compare its m=1 with
    row = engine_table([reference, other]).filter((pl.col("engine") == "other (run)") & (pl.col("role") == "m=1")).row(0, named=True)
    assert (row["requests"], row["token_identical"], row["earliest_divergence"], row["min_bitwise_prefix"], row["max_ulp"]) == (0, 0, None, None, None)


def test_prompts_without_text_or_only_on_one_side_are_no_error_and_the_error_names_both_runs(tmp_path):
    reference = _multi(tmp_path, "ref", {"p": (A, A, [A, A])}, texts={"p": "x"})
    untitled = _multi(tmp_path, "untitled2", {"p": (A, A, [A, A]), "q": (A, A, [])}, texts={"p": None, "q": "y"})
    assert engine_table([reference, untitled]).height == 4  # p has no text on one side; q is only in one run (and has no band)
    other = _multi(tmp_path, "other", {"p": (A, A, [A, A])}, texts={"p": "z"})
    with pytest.raises(RunError) as caught:
        engine_table([reference, other])
    assert str(caught.value) == ("assembled run: prompt 'p' is 'z', but the reference sent 'x' under that id; "
                                 "engines are compared on the same prompts")


def test_runs_given_as_paths_no_runs_and_the_order_of_engines():
    assert engine_table([]).columns == ["engine", "run", "role", "c", "requests", "token_identical", "earliest_divergence",
                                        "min_bitwise_prefix", "max_ulp", "max_abs_delta", "own_m1_bit_identical"]
    table = engine_table([str(ROOT / "data" / "experiment-cpu" / name) for name in ("fixed-tiles", "default", "batch-invariant")],
                         reference=1)
    assert table.filter(pl.col("role") == "m=1")["engine"].to_list() == ["bia torch (analysis.experiment) (fixed-tiles)",
                                                                        "bia torch (analysis.experiment) (default)",
                                                                        "bia torch (analysis.experiment) (batch-invariant)"]


def test_the_reference_engine_is_torch_in_its_default_mode():
    from types import SimpleNamespace

    from analysis.studies._engines import default_engine_reference

    def run(engine=None, mode=None):
        return SimpleNamespace(manifest={"identity": {"engine": engine} if engine else None, "effective": {"kernel_mode": mode} if mode else None})

    torch_engine = "bia torch (analysis.experiment)"
    assert default_engine_reference([run("llama.cpp server"), run(torch_engine, "fixed-tiles"), run(torch_engine, "default")]) == 2
    assert default_engine_reference([run("vLLM", "default"), run(torch_engine, "one-by-one"), run()]) == 0  # none: the first
    assert default_engine_reference([run(), run("vLLM"), run(torch_engine, "default"), run(torch_engine, "default")]) == 2


def test_a_manifest_without_prompts_is_compared_by_its_captures(tmp_path):
    reference = _multi(tmp_path, "ref", {"p": (A, A, [A, A])})
    bare = _multi(tmp_path, "bare", {"p": (A, A, [A, A])})
    del bare.manifest["prompts"]  # a run may name no prompts: its captures still say which prompt each request is
    assert engine_table([reference, bare]).filter(pl.col("role") == "band")["token_identical"].to_list() == [2, 2]
