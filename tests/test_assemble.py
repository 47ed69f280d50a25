"""Loose dumps to a run and a report: ``analysis.write_run``, ``assemble_dumps``, ``bia assemble`` and ``bia report DUMPS``."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import polars as pl
import pytest
from _cli import bia
from typer.testing import CliRunner

from analysis import OutputExists, assemble_run, read_run, write_run
from analysis.cli import app
from analysis.run import RunError, assemble_dumps

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "samples"
CHAT = SAMPLES / "vllm_chat_nonstream_token_ids__OpenPipe-ART.json"  # a real vLLM chat completion with logprobs, pretty-printed
STREAM = SAMPLES / "openai_chat_stream_include_usage__langchain.reframed.sse"
RESPONSE = json.loads(CHAT.read_text())
WHERE = ["source", "record", "raw_sha256"]  # where a request lies: what a copy into a run directory changes


def _named(response: dict, name: str) -> dict:
    return {**response, "id": f"{response.get('id')}-{name}"}


def _drifted(k: int, delta: float) -> dict:
    """The real response with the logprob of token ``k`` moved by ``delta`` (its token unchanged)."""
    response = copy.deepcopy(RESPONSE)
    response["choices"][0]["logprobs"]["content"][k]["logprob"] += delta
    return response


def band_dumps(folder: Path) -> Path:
    """A folder of chat completions in capture envelopes: two m=1 references, a band of 1 and a band of 4 whose slot 2's
    logprobs drift (tokens the same); each response has an id of its own, as a server's do."""
    folder.mkdir(parents=True, exist_ok=True)
    for slot in (0, 1):
        (folder / f"ref{slot + 1}.json").write_text(json.dumps({"response": _named(RESPONSE, f"ref{slot + 1}"), "prompt_id": "p0",
                                                                "role": "reference", "slot": slot}, indent=2))
    (folder / "c1.json").write_text(json.dumps({"response": _named(RESPONSE, "c1"), "prompt_id": "p0", "role": "band", "c": 1, "slot": 0,
                                                "repeat": 0}))
    lines = [{"response": _named(_drifted(3, -1e-6) if slot == 2 else RESPONSE, f"c4s{slot}"), "prompt_id": "p0", "role": "band", "c": 4,
              "slot": slot, "repeat": 0, "t_sent": 0.5, "note": "kept"} for slot in range(4)]
    (folder / "c4.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def _frames(run) -> dict[str, pl.DataFrame]:
    return {name: getattr(run.dump, name).drop(WHERE, strict=False) for name in ("requests", "tokens", "candidates")}


# --- write_run ------------------------------------------------------------------------------------


def test_write_run_reads_back_to_equal_frames(tmp_path):
    folder = band_dumps(tmp_path / "dumps")
    run = assemble_run([
        {"source": str(CHAT), "prompt_id": "p0", "role": "reference", "slot": 0},
        {"source": str(STREAM), "prompt_id": "p0", "role": "band", "c": 1, "slot": 0, "repeat": 0},
    ] + [{"source": str(folder / "ref2.json"), "prompt_id": "p0", "role": "reference", "slot": 1}])
    written = write_run(run, tmp_path / "run")
    back = read_run(written, cache=False)
    for name, frame in _frames(run).items():
        assert frame.equals(_frames(back)[name]), name
    assert back.dump.requests.height == 3 and back.manifest["run_version"] == 2
    assert [o["source"] for o in back.manifest["assembled_from"]] == [str(CHAT), str(STREAM), str(folder / "ref2.json")]
    lines = [json.loads(line) for line in (written / "captures" / "requests.jsonl").read_text().splitlines()]
    assert lines[1]["sse"] == STREAM.read_text()  # a stream's bytes as received
    raw = (written / "captures" / "requests.jsonl").read_text().splitlines()[0]
    assert CHAT.read_text().strip().replace("\n", "") in raw  # a response's own bytes, its line breaks (whitespace) dropped


def test_write_run_of_an_envelope_file_keeps_its_other_keys_and_reads_back(tmp_path):
    run = assemble_dumps(band_dumps(tmp_path / "dumps"))
    back = read_run(write_run(run, tmp_path / "run"), cache=False)
    for name, frame in _frames(run).items():
        assert frame.equals(_frames(back)[name]), name
    band = back.dump.requests.filter(pl.col("c") == 4).sort("slot")
    assert band["t_sent"].to_list() == [0.5] * 4 and all(json.loads(e)["note"] == "kept" for e in band["extra"])


def test_write_run_round_trips_a_probe_run(tmp_path):
    run = read_run(ROOT / "data" / "llamacpp-cpu" / "no-cache-prompt", cache=False)
    back = read_run(write_run(run, tmp_path / "copy"), cache=False)
    for name, frame in _frames(run).items():
        assert frame.equals(_frames(back)[name]), name


def test_write_run_refuses_an_occupied_folder_unless_forced(tmp_path):
    run = assemble_dumps(CHAT)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(OutputExists, match="give force=True to overwrite it$"):  # Python's words; bia assemble says --force
        write_run(run, tmp_path / "run")
    write_run(run, tmp_path / "run", force=True)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["captures", "manifest.json"]


# --- placing dumps ----------------------------------------------------------------------------------


def test_envelopes_place_every_request(tmp_path):
    run = assemble_dumps(band_dumps(tmp_path / "dumps"))
    placed = run.dump.requests.select("prompt_id", "role", "c", "slot").sort("role", "c", "slot", nulls_last=True).rows()
    assert placed == [("p0", "band", 1, 0), *[("p0", "band", 4, s) for s in range(4)], ("p0", "reference", None, 0), ("p0", "reference", None, 1)]
    assert run.ladder == [1, 4]


def test_a_lone_plain_dump_is_ref_1():
    run = assemble_dumps(CHAT)
    assert run.dump.requests.select("prompt_id", "role", "slot").rows() == [("p0", "reference", 0)] and run.ladder == []


def test_plain_dumps_name_the_file_and_the_missing_field(tmp_path):
    (tmp_path / "a.json").write_text(CHAT.read_text())
    (tmp_path / "b.json").write_text(CHAT.read_text())
    with pytest.raises(RunError, match=r'a\.json: field "role" missing: .*--mapping.*--band-per-file'):
        assemble_dumps(tmp_path)


def test_an_envelope_without_c_is_named(tmp_path):
    folder = band_dumps(tmp_path / "dumps")
    line = {"response": RESPONSE, "prompt_id": "p0", "role": "band", "slot": 0}
    (folder / "c8.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(RunError, match=r'c8\.jsonl: line 1: field "c" missing'):
        assemble_dumps(folder)


def test_bands_without_a_reference_and_two_requests_in_one_place_are_refused(tmp_path):
    folder = band_dumps(tmp_path / "dumps")
    (folder / "ref1.json").unlink()
    with pytest.raises(RunError, match="prompt 'p0' has bands but no m=1 reference"):
        assemble_dumps(folder)
    (folder / "again.json").write_text(json.dumps({"response": RESPONSE, "prompt_id": "p0", "role": "reference", "slot": 1}))
    with pytest.raises(RunError, match=r"ref2\.json: line 1: reference slot 1 of prompt 'p0' is already taken by .*again\.json"):
        assemble_dumps(folder)


def test_a_mapping_file_says_which_file_is_which(tmp_path):
    for name in ("alone.json", "c1.json"):
        (tmp_path / name).write_text(CHAT.read_text())
    (tmp_path / "map.csv").write_text("source,prompt_id,role,c,slot,repeat\nalone.json,q,reference,,0,\nc1.json,q,band,1,0,0\n")
    run = assemble_dumps(mapping=tmp_path / "map.csv")
    assert sorted(run.dump.requests.select("prompt_id", "role", "c").rows(), key=str) == [("q", "band", 1), ("q", "reference", None)]
    (tmp_path / "map.json").write_text(json.dumps({"alone.json": {"prompt_id": "q", "role": "reference", "slot": 0},
                                                   "c1.json": {"prompt_id": "q", "role": "band", "c": "x", "slot": 0}}))
    with pytest.raises(RunError, match=r'map\.json: \[1\]: field "c": expected an integer'):
        assemble_dumps(mapping=tmp_path / "map.json")


def test_one_band_per_file(tmp_path):
    (tmp_path / "a-alone.json").write_text(CHAT.read_text())
    (tmp_path / "b-c4.jsonl").write_text("".join(json.dumps(RESPONSE) + "\n" for _ in range(4)))
    run = assemble_dumps(tmp_path, band_per_file=True)
    assert run.dump.requests.select("role", "c", "slot").sort("slot").rows()[:2] == [("reference", None, 0), ("band", 4, 0)]
    assert sorted(run.dump.requests.filter(pl.col("role") == "band")["slot"].to_list()) == [0, 1, 2, 3] and run.ladder == [4]


# --- bia assemble ---------------------------------------------------------------------------------


def test_bia_assemble_writes_a_run_that_read_run_reads(tmp_path):
    folder = band_dumps(tmp_path / "dumps")
    result = CliRunner().invoke(app, ["assemble", str(folder), "-o", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "7 requests, 1 prompt(s), ladder [1, 4]" in result.stdout
    assert read_run(tmp_path / "run").dump.requests.filter(pl.col("role") == "band").height == 5
    again = CliRunner().invoke(app, ["assemble", str(folder), "-o", str(tmp_path / "run")])
    assert again.exit_code == 2 and "give --force to overwrite it" in again.stderr and "force=True" not in again.stderr


def test_bia_assemble_refuses_what_it_cannot_place_or_read(tmp_path):
    (tmp_path / "a.json").write_text(CHAT.read_text())
    (tmp_path / "b.json").write_text(CHAT.read_text())
    result = CliRunner().invoke(app, ["assemble", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 2 and f'{tmp_path / "a.json"}: field "role" missing' in result.stderr
    assert not (tmp_path / "run").exists()
    (tmp_path / "hello.json").write_text('{"hello": 1}')
    result = CliRunner().invoke(app, ["assemble", str(tmp_path / "hello.json"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 4 and f"{tmp_path / 'hello.json'}: not a logprob dump bia reads" in result.stderr
    result = CliRunner().invoke(app, ["assemble", str(tmp_path / "absent.json"), "-o", str(tmp_path / "run")])
    assert result.exit_code == 3 and "no such file" in result.stderr
    result = CliRunner().invoke(app, ["assemble", str(tmp_path), "--band-per-file", "-o", str(tmp_path / "run")])
    # hello.json found in the folder is no dump: skipped with a note, as every command skips a stray file (issue 41)
    assert result.exit_code == 0 and f"note: skipped {tmp_path / 'hello.json'} (not a witness, marker, dump or run" in result.stderr


# --- bia report on dumps --------------------------------------------------------------------------


def _text(page: Path) -> str:
    from test_report import visible_text

    return " ".join(visible_text(page.read_text()).split())


def test_bia_report_on_a_folder_of_dumps_with_band_metadata(tmp_path):
    folder = band_dumps(tmp_path / "dumps")
    result = bia("report", str(folder), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    text = _text(tmp_path / "r.html")
    assert ("RED (co-batching): 1 of 4 batched requests part from m=1 (0 in tokens, 1 only in bits); the first is p0 c=4 repeat 0 slot 2: "
            "its logprob bits differ from ref #1 from token 3") in text
    assert "4 4 75% (3 of 4) 100% (4 of 4)" in text  # c=4: three of four requests bit-identical, all token-identical
    assert f"assembled from {folder / 'c1.json'}" in text
    # the run is named by what was given, not by the scratch folder it was written to and that is gone (issue 22 item 3)
    assert "run dumps (assembled) RED (co-batching)" in text and "bia-report-" not in (tmp_path / "r.html").read_text()


def test_bia_report_on_a_lone_dump_says_what_it_cannot_judge(tmp_path):
    result = bia("report", str(CHAT), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    assert "one request allows no batch comparison" in result.stderr
    text = _text(tmp_path / "r.html")
    assert "UNVERIFIED: one request, no batch comparison." in text and "its ladder holds no batch size above 1: nothing was batched" in text
    assert f"run {CHAT.name} (assembled) UNVERIFIED: one request" in text and "bia-report-" not in (tmp_path / "r.html").read_text()
    assert "read one request (openai_chat, test): 10 completion token(s), 10 with a logprob" in text
    assert "cannot judge batch invariance." in text


def test_bia_report_on_a_file_it_cannot_read_says_what_it_reads(tmp_path):
    hello = tmp_path / "chat.json"
    hello.write_text('{"hello": 1}')
    result = CliRunner().invoke(app, ["report", str(hello), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 4 and "Traceback" not in result.stderr
    assert f"{hello}: neither a witness (no witness_version), a release marker, a run directory nor a logprob dump" in result.stderr
    assert "bia report reads witness and release-marker files (JSON), run directories (with manifest.json) and logprob dumps" in result.stderr
    assert not (tmp_path / "r.html").exists()


def test_bia_report_refuses_dumps_it_cannot_place_before_the_notebook(tmp_path):
    (tmp_path / "a.json").write_text(CHAT.read_text())
    (tmp_path / "b.json").write_text(CHAT.read_text())
    result = CliRunner().invoke(app, ["report", str(tmp_path), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 2 and f'{tmp_path / "a.json"}: field "role" missing' in result.stderr


def test_a_run_is_called_by_its_manifest_label_where_it_has_one(tmp_path):
    """What bia report sets on a run it assembles from dumps: the card, the detail and the side-by-side table name it."""
    from analysis.views.html import mode_comparison_html, run_details_html

    run = read_run(write_run(assemble_dumps(band_dumps(tmp_path / "dumps")), tmp_path / "scratch" / "run"))
    assert run.label == str(tmp_path / "scratch" / "run")  # no label: the path, as before
    labelled = read_run(write_run(dataclasses.replace(run, manifest={**run.manifest, "label": "my <dumps>"}), tmp_path / "labelled"))
    assert labelled.label == "my <dumps>"
    for page in (labelled._repr_html_(), run_details_html(labelled, epsilon=0.05), mode_comparison_html([labelled, run])):
        assert "my &lt;dumps&gt;" in page and str(tmp_path / "labelled") not in page  # escaped, and the folder is not named


def test_a_witness_needs_the_max_tokens_an_assembled_run_does_not_know(tmp_path):
    """bia witness RUN_DIR points at write_witness; on a run assembled from dumps it wrote a witness of no bands, every request
    refused as "completion_tokens=10 != n_predict=0", and bia shape-check said "RED: the witness measured no bands"."""
    from analysis import write_witness
    from analysis.run import to_witness

    folder = band_dumps(tmp_path / "dumps")
    with pytest.raises(RunError, match=r"records no max_tokens .*sampler.*max_tokens"):
        write_witness(read_run(write_run(assemble_dumps(folder), tmp_path / "run")))
    assert not (tmp_path / "run" / "witness.json").exists()
    # told the request's length (the sample's 10 completion tokens) and a declared_min within it, the same dumps make bands
    witness = to_witness(assemble_dumps(folder, manifest={"sampler": {"max_tokens": 10}, "declared_min": 8}))
    assert witness["reference"]["stable"] and [band["c"] for band in witness["bands"]] == [1, 4]


def test_the_report_gate_says_why_an_assembled_run_has_no_witness(tmp_path):
    """bia report DUMPS --admission judges each prompt's witness; with no max_tokens there is none, and the gate says so."""
    result = bia("report", str(band_dumps(tmp_path / "dumps")), "--admission", "-o", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    assert "RED: no witness: dumps (assembled): the manifest records no max_tokens" in _text(tmp_path / "r.html")


# --- bia report on a folder that holds more than dumps (issue 32, item 4) ---------------------------------


def test_files_in_a_folder_that_are_no_dump_are_said_and_left_out(tmp_path):
    from analysis.report._inputs import not_a_dump, sort_sources

    run = tmp_path / "runs" / "default"
    shutil.copytree(ROOT / "data" / "experiment-cpu" / "default", run, ignore=shutil.ignore_patterns("derived"))
    (tmp_path / "runs" / "trainer").mkdir()
    beside = shutil.copy(ROOT / "data" / "experiment-cpu" / "trainer" / "default.jsonl", tmp_path / "runs" / "trainer" / "default.jsonl")
    loose = shutil.copy(ROOT / "data" / "vllm-hf-pair" / "pairs.jsonl", tmp_path / "pairs.jsonl")
    config = shutil.copy(ROOT / "data" / "tiny-model" / "tiny_lm.json", tmp_path / "config.json")
    dump = shutil.copy(CHAT, tmp_path / "chat.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"object": "chat.completion", "choices": [')  # a dump cut short: the reader names it, it is not skipped
    assert not_a_dump(Path(beside), [run]) == f"sampler-trainer pairs of {run}: the report's RL section reads them"
    assert not_a_dump(Path(loose), [run]) == "sampler-trainer pairs, not a dump of a run: analysis.mismatch_summary reads them"
    assert not_a_dump(Path(config), [run]) == "JSON that matches no dump format"
    assert not_a_dump(Path(dump), [run]) is None and not_a_dump(broken, [run]) is None
    runs, witnesses, dumps, skipped = sort_sources([str(tmp_path)])
    assert runs == [str(run)] and witnesses == [] and dumps == [str(broken), str(dump)]
    assert [Path(file).name for file, _ in skipped] == ["config.json", "pairs.jsonl", "default.jsonl"]


def test_bia_report_on_the_bundled_experiment_folder_reads_its_runs_and_their_pairs(tmp_path):
    result = bia("report", str(ROOT / "data" / "experiment-cpu"), "-o", str(tmp_path / "r.html"))
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 4 and all(
        "(not a witness, marker, dump or run: sampler-trainer pairs of" in note for note in notes
    )
    text = _text(tmp_path / "r.html")
    assert "Sampler and trainer" in text and text.count("(copies)") >= 4  # the four kernel modes, and their pairs in the RL section
