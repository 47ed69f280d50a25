"""MLPerf Inference accuracy logs as a run: ``analysis.read_mlperf_pair`` (accuracy mode the m=1 reference, performance mode batched).

The logs are written here as loadgen writes them (``loadgen/logging.cc``: a JSON list, one ``{ "seq_id" : .., "qsl_idx" : ..,
"data" : ".." }`` a line, the SUT's response bytes in upper-case hex), the bytes being a numpy array's ``.tobytes()`` as the
reference SUTs hand them over (``language/llama2-70b/SUT.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

import analysis
from analysis import DumpError, judge, read_mlperf_pair

# Four samples' outputs (token ids), as accuracy mode gave them.
OUTPUTS = {0: [1, 15043, 29892, 2], 1: [450, 6221, 1024, 310, 278, 2], 2: [306, 626, 263, 4086, 1904, 29889, 2], 3: [2]}


def hex_of(ids, dtype="int64") -> str:
    return np.asarray(ids, dtype=dtype).tobytes().hex().upper()


def write_log(path: Path, entries: list[dict]) -> Path:
    """A list of entries, one a line, in loadgen's spacing."""
    lines = ["{ " + ", ".join(f'"{k}" : {json.dumps(v)}' for k, v in entry.items()) + " }" for entry in entries]
    path.write_text("[\n" + ",\n".join(lines) + "\n]\n")
    return path


def log(path: Path, outputs: dict[int, list[int]] | list[tuple[int, list[int]]], dtype: str = "int64") -> Path:
    """An accuracy log of these (qsl_idx, token ids), seq_id in order."""
    pairs = list(outputs.items()) if isinstance(outputs, dict) else outputs
    return write_log(path, [{"seq_id": k, "qsl_idx": q, "data": hex_of(ids, dtype)} for k, (q, ids) in enumerate(pairs)])


@pytest.fixture
def accuracy(tmp_path: Path) -> Path:
    return log(tmp_path / "accuracy.json", OUTPUTS)


def with_sample(qsl_idx: int, ids: list[int]) -> dict[int, list[int]]:
    return {**OUTPUTS, qsl_idx: ids}


# --- what the judgement says ---------------------------------------------------------------------------------


def test_identical_logs_part_nowhere_and_are_unverified_as_their_bits_are_unknown(tmp_path, accuracy):
    # performance mode in another order (loadgen logs samples as they complete): matched by qsl_idx, not by place
    performance = log(tmp_path / "performance.json", sorted(OUTPUTS.items(), reverse=True))
    row = judge(read_mlperf_pair(accuracy, performance, batch_size=8)).frame.row(0, named=True)
    assert (row["verdict"], row["requests"], row["divergent"], row["tokens_parted"], row["bits_unknown"]) == ("UNVERIFIED", 4, 0, 0, 4)
    assert row["reason"] == ("no request parts from m=1, but 4 of 4 batched bands never seen formed at their c (the first qsl0 c=8 repeat 0: "
                             "no width seen); 4 of 4 batched requests have their bits unknown (a logprob not recorded, or null, NaN or infinite, on either side)")
    assert row["next_step"] == ("MLPerf's accuracy logs record neither logprobs nor batch widths: for both, serve the SUT's model and "
                                "bia probe URL --arms mixed --ladder 1,8")
    assert judge(read_mlperf_pair(accuracy, performance, batch_size=8)).exit_code == 7


def test_the_run_card_counts_equal_tokens_without_logprobs_as_bits_unknown_not_bit_identical(tmp_path, accuracy):
    run = read_mlperf_pair(accuracy, log(tmp_path / "performance.json", with_sample(3, [7])), batch_size=8)
    card = run._repr_html_()
    assert "c=8: 0 of 4 requests bit-identical to ref #1, 3 with bits unknown (no logprobs), 3 token-identical" in card
    assert 'data-verdict="RED"' in card


def test_the_reports_card_says_the_bits_were_not_recorded(tmp_path, accuracy):
    from analysis.views.html import run_review

    review = run_review(read_mlperf_pair(accuracy, log(tmp_path / "performance.json", OUTPUTS), batch_size=8), epsilon=0.05)
    assert ("bits", "not recorded: only tokens were kept, not their float32 logprobs.", None) in review.lines
    assert review.per_c["bit-identical to m=1"].to_list() == ["not recorded"] and review.verdict == "UNVERIFIED"


def test_a_sample_whose_tokens_part_at_k_is_red_and_named_with_k(tmp_path, accuracy):
    # qsl 2: [306, 626, 263, 4086, ...] in accuracy mode, [306, 626, 263, 1576, ...] batched: the first three agree, token 3 parts
    performance = log(tmp_path / "performance.json", with_sample(2, [306, 626, 263, 1576, 1904, 29889, 2]))
    judgement = judge(read_mlperf_pair(accuracy, performance, batch_size=16))
    row = judgement.frame.row(0, named=True)
    assert (row["verdict"], row["cause"], row["divergent"], row["requests"]) == ("RED", "mixing", 1, 4)
    assert row["first"] == "qsl2 c=16 repeat 0 slot 0: its tokens part at token 3"
    assert row["reason"] == ("1 of 4 batched requests part from m=1 (1 in tokens, 0 only in bits); the first is qsl2 c=16 repeat 0 slot 0: "
                             "its tokens part at token 3")
    assert {k: row["first_request"][k] for k in ("prompt_id", "c", "repeat", "slot", "parted", "position")} == {
        "prompt_id": "qsl2", "c": 16, "repeat": 0, "slot": 0, "parted": "tokens", "position": 3}
    assert judgement.exit_code == 5


def test_an_output_that_stops_early_parts_where_it_stops(tmp_path, accuracy):
    # qsl 1 batched ends after its first 4 of 6 tokens: it took another token (its end) at token 4
    performance = log(tmp_path / "performance.json", with_sample(1, OUTPUTS[1][:4]))
    assert judge(read_mlperf_pair(accuracy, performance, batch_size=4)).frame["first"][0] == "qsl1 c=4 repeat 0 slot 0: its tokens part at token 4"


def test_each_entry_of_a_repeated_sample_is_a_repeat_in_log_order(tmp_path, accuracy):
    # qsl 3 three times: the third (repeat 2) parts at token 0; the first two match
    entries = [(3, [2]), (0, OUTPUTS[0]), (3, [2]), (3, [13, 2])]
    run = read_mlperf_pair(accuracy, log(tmp_path / "performance.json", entries), batch_size=8)
    bands = run.dump.requests.filter(pl.col("role") == "band").select("prompt_id", "repeat", "record")
    assert bands.rows() == [("qsl3", 0, 0), ("qsl0", 0, 1), ("qsl3", 1, 2), ("qsl3", 2, 3)]
    assert judge(run).frame["first"][0] == "qsl3 c=8 repeat 2 slot 0: its tokens part at token 0"


def test_without_a_batch_size_each_band_is_c2_and_the_label_says_the_batch_size_is_unknown(tmp_path, accuracy):
    performance = log(tmp_path / "performance.json", with_sample(0, [1, 15043, 3, 2]))
    run = read_mlperf_pair(accuracy, performance)
    assert run.ladder == [2] and run.manifest["mlperf"]["batch_size"] is None
    assert run.label == f"{performance} against {accuracy} (batch size unknown: c=2 stands for any batch above 1)"
    row = judge(run).frame.row(0, named=True)
    assert (row["verdict"], row["run"], row["first"]) == ("RED", run.label, "qsl0 c=2 repeat 0 slot 0: its tokens part at token 2")


def test_a_batch_size_of_1_is_judged_as_requests_sent_alone(tmp_path, accuracy):
    performance = log(tmp_path / "performance.json", with_sample(0, [1, 15043, 3, 2]))
    row = judge(read_mlperf_pair(accuracy, performance, batch_size=1)).frame.row(0, named=True)
    assert (row["verdict"], row["cause"], row["requests"]) == ("RED", "run-to-run", 0)
    assert row["first"] == "qsl0 sent alone (mixed c=1 repeat 0 slot 0): its tokens part at token 2"


def test_samples_only_in_the_accuracy_log_are_listed_in_the_manifest_not_missing(tmp_path, accuracy):
    performance = log(tmp_path / "performance.json", [(3, OUTPUTS[3]), (1, OUTPUTS[1])])  # loadgen logged two samples of four
    run = read_mlperf_pair(accuracy, performance, batch_size=8)
    assert run.missing() == [] and run.manifest["complete"] is True
    assert {k: run.manifest["mlperf"][k] for k in ("reference_entries", "performance_entries", "samples_compared", "reference_only")} == {
        "reference_entries": 4, "performance_entries": 2, "samples_compared": 2, "reference_only": [0, 2]}
    references = run.dump.requests.filter(pl.col("role") == "reference").select("prompt_id", "record", "completion_tokens")
    assert references.rows() == [("qsl1", 1, 6), ("qsl3", 3, 1)]  # each at its entry in the accuracy log, with its own tokens
    ref_tokens = run.dump.tokens.filter(pl.col("source") == str(accuracy))
    assert ref_tokens.select("record", "token_id").rows() == [(1, t) for t in OUTPUTS[1]] + [(3, t) for t in OUTPUTS[3]]
    assert judge(run).frame["requests"][0] == 2


# --- what the run holds ------------------------------------------------------------------------------------


def test_every_token_is_a_row_with_its_id_and_no_logprob(tmp_path, accuracy):
    performance = log(tmp_path / "performance.json", OUTPUTS)
    run = read_mlperf_pair(accuracy, performance, batch_size=8)
    tokens = run.dump.tokens
    assert tokens.schema == analysis.dumps.TOKEN_SCHEMA and run.dump.requests.height == 8
    assert tokens.height == 2 * sum(map(len, OUTPUTS.values()))  # nothing dropped
    assert set(tokens["value_status"]) == {"missing"} and tokens["logprob"].null_count() == tokens.height
    requests = run.dump.requests.sort("source", "record")
    for source in (str(accuracy), str(performance)):
        for record, (qsl_idx, ids) in enumerate(OUTPUTS.items()):
            mine = tokens.filter((pl.col("source") == source) & (pl.col("record") == record)).sort("position")
            assert mine["token_id"].to_list() == ids and mine["position"].to_list() == list(range(len(ids)))
            request = requests.filter((pl.col("source") == source) & (pl.col("record") == record)).row(0, named=True)
            assert (request["sample_key"], request["request_id"], request["completion_tokens"]) == (str(qsl_idx), str(record), len(ids))
    roles = requests.group_by("source", "role", "slot", "c").len().sort("source").rows()
    assert roles == [(str(accuracy), "reference", 0, None, 4), (str(performance), "band", 0, 8, 4)]


def test_loadgens_token_count_and_token_data_are_checked_and_kept(tmp_path):
    # compliance TEST06's Server logs carry both: the first token again, and the SUT's count of tokens
    entry = {"seq_id": 59, "qsl_idx": 9724, "data": hex_of([450, 6221, 2], "int32"), "token_data": hex_of([450], "int32"), "token_count": 3}
    accuracy = write_log(tmp_path / "accuracy.json", [entry])
    performance = write_log(tmp_path / "performance.json", [{**entry, "seq_id": 7}])
    run = read_mlperf_pair(accuracy, performance, dtype="int32", batch_size=2)
    assert run.dump.tokens["token_id"].to_list() == [450, 6221, 2, 450, 6221, 2]
    assert json.loads(run.dump.requests["extra"][0]) == {"mlperf": {"token_count": 3, "token_data": "C2010000"}}
    with pytest.raises(DumpError, match=r"entry 0\.token_count: says 3 tokens, but data holds 1 int64 token ids") as caught:
        read_mlperf_pair(write_log(tmp_path / "a64.json", [{**entry, "data": hex_of([450, 6221], "int32")}]), performance, batch_size=2)
    assert (caught.value.source, caught.value.record, caught.value.field) == (str(tmp_path / "a64.json"), "entry 0", "token_count")


def test_int32_logs_read_with_dtype_int32_and_int64_reads_its_bytes_otherwise(tmp_path):
    outputs = {0: [1, 2, 3, 4], 1: [306, 626]}
    accuracy, performance = log(tmp_path / "a.json", outputs, "int32"), log(tmp_path / "p.json", outputs, "int32")
    assert read_mlperf_pair(accuracy, performance, dtype="int32").dump.tokens["token_id"].to_list()[:6] == [1, 2, 3, 4, 306, 626]
    # the same bytes as int64: each pair of int32 ids is one little-endian int64 (1 + 2 * 2**32, ...); only a token_count could tell
    wide = read_mlperf_pair(accuracy, performance, dtype="int64").dump.tokens["token_id"].to_list()[:3]
    assert wide == [1 + 2 * 2**32, 3 + 4 * 2**32, 306 + 626 * 2**32]
    odd = log(tmp_path / "odd.json", {0: [1, 2, 3]}, "int32")  # three int32 ids: 12 bytes, no whole number of int64s
    with pytest.raises(DumpError, match=r"odd\.json: entry 0\.data: 12 bytes is no whole number of int64 token ids \(8 bytes each\)"):
        read_mlperf_pair(odd, performance)


def test_lower_case_hex_as_numpy_writes_it_reads_too(tmp_path):
    entries = [{"seq_id": 0, "qsl_idx": 5, "data": np.array([10, 255], np.int64).tobytes().hex()}]
    run = read_mlperf_pair(write_log(tmp_path / "a.json", entries), write_log(tmp_path / "p.json", entries), batch_size=2)
    assert run.dump.tokens["token_id"].to_list() == [10, 255, 10, 255]


# --- every refusal names the file, the entry and the field ------------------------------------------------------


def _refused(tmp_path: Path, text: str, *, as_performance: bool = False, dtype: str = "int64") -> DumpError:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    good = log(tmp_path / "good.json", OUTPUTS)
    with pytest.raises(DumpError) as caught:
        read_mlperf_pair(good, bad, dtype=dtype) if as_performance else read_mlperf_pair(bad, good, dtype=dtype)
    assert caught.value.source == str(bad)
    return caught.value


GOOD = {"seq_id": 0, "qsl_idx": 0, "data": hex_of(OUTPUTS[0])}


@pytest.mark.parametrize(("entries", "record", "field", "problem"), [
    ({"qsl_idx": 0}, "$", None, "expected a JSON list of {seq_id, qsl_idx, data} entries (loadgen's accuracy log), got a JSON dict"),
    ([GOOD, [0, 0, "00"]], "entry 1", None, "expected an object {seq_id, qsl_idx, data}, got list [0, 0, '00']"),
    ([GOOD, {"seq_id": 1, "data": "00" * 8}], "entry 1", "qsl_idx", "missing: the sample's index in the query sample library"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1}], "entry 1", "data", "missing: the hex of the output token ids"),
    ([GOOD, {"seq_id": 1, "qsl_idx": "1", "data": ""}], "entry 1", "qsl_idx", "expected an integer >= 0, got '1'"),
    ([GOOD, {"seq_id": 1, "qsl_idx": True, "data": ""}], "entry 1", "qsl_idx", "expected an integer >= 0, got True"),
    ([GOOD, {"seq_id": 1, "qsl_idx": -1, "data": ""}], "entry 1", "qsl_idx", "expected an integer >= 0, got -1"),
    ([GOOD, {"seq_id": 1.5, "qsl_idx": 1, "data": ""}], "entry 1", "seq_id", "expected an integer >= 0, got 1.5"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1, "data": [1, 2]}], "entry 1", "data", "expected a hex string, got list"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1, "data": "0" * 17}], "entry 1", "data", "17 hex digits: an odd count is no whole number of bytes"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1, "data": "00" * 12}], "entry 1", "data",
     "12 bytes is no whole number of int64 token ids (8 bytes each); was the log written with another dtype?"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1, "data": "0A" * 7 + "0G"}], "entry 1", "data", "character 15 is 'G', not a hex digit"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1, "data": "0A" * 6 + " 0A "}], "entry 1", "data", "character 12 is ' ', not a hex digit"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1, "data": "0A" * 7 + "0é"}], "entry 1", "data", "character 15 is 'é', not a hex digit"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1, "data": "00" * 8, "token_count": -2}], "entry 1", "token_count", "expected an integer >= 0, got -2"),
    ([GOOD, {"seq_id": 1, "qsl_idx": 1, "data": "00" * 8, "token_count": 2}], "entry 1", "token_count",
     "says 2 tokens, but data holds 1 int64 token ids (the SUT's n_tokens disagrees with its output, or the log was written with another dtype)"),
])
def test_a_log_not_in_loadgens_shape_is_refused_naming_the_entry_and_field(tmp_path, entries, record, field, problem):
    error = _refused(tmp_path, json.dumps(entries))
    assert (error.record, error.field, error.problem) == (record, field, problem)
    assert str(error) == f"{tmp_path / 'bad.json'}: {record}{'.' + field if field else ''}: {problem}"


def test_text_that_is_not_json_or_names_a_key_twice_is_refused(tmp_path):
    cut = _refused(tmp_path, json.dumps([GOOD])[:-3])
    assert cut.record == "$" and cut.problem.startswith("not valid JSON at line 1 column ")  # every reader's words (_strictjson)
    twice = _refused(tmp_path, '[{"seq_id": 0, "qsl_idx": 0, "qsl_idx": 1, "data": ""}]')
    assert (twice.record, twice.field) == ("$", "[0].qsl_idx") and "more than once" in twice.problem


def test_a_performance_sample_the_accuracy_log_lacks_is_refused(tmp_path):
    error = _refused(tmp_path, json.dumps([GOOD, {"seq_id": 1, "qsl_idx": 9, "data": hex_of([2])}]), as_performance=True)
    assert (error.record, error.field) == ("entry 1", "qsl_idx")
    assert error.problem == (f"sample 9 is not in the accuracy log {tmp_path / 'good.json'}, which holds every sample accuracy mode ran: "
                             "the two logs are not a pair")


def test_an_accuracy_log_holding_a_sample_twice_is_refused(tmp_path):
    error = _refused(tmp_path, json.dumps([GOOD, {"seq_id": 1, "qsl_idx": 3, "data": ""}, {**GOOD, "seq_id": 2}]))
    assert (error.record, error.field) == ("entry 2", "qsl_idx")
    assert error.problem == "sample 0 again (first at entry 0): an accuracy-mode log holds each sample once, its reference"


def test_an_empty_performance_log_is_refused_saying_why_loadgen_leaves_it_empty(tmp_path):
    error = _refused(tmp_path, "[\n]\n", as_performance=True)  # what a performance run writes without accuracy logging
    assert error.record == "$" and error.problem.startswith("no entries: loadgen logs performance mode's responses only when asked to")


def test_wrong_arguments_are_refused(tmp_path, accuracy):
    performance = log(tmp_path / "performance.json", OUTPUTS)
    with pytest.raises(ValueError, match="the same file as the accuracy log"):
        read_mlperf_pair(accuracy, accuracy)
    with pytest.raises(ValueError, match=r"dtype must be one of 'int64', 'int32' \(how the SUT wrote its token ids\), got 'float32'"):
        read_mlperf_pair(accuracy, performance, dtype="float32")
    for size in (0, True, 2.0):
        with pytest.raises(ValueError, match=r"batch_size must be an integer >= 1 \(the performance run's batch size\) or None"):
            read_mlperf_pair(accuracy, performance, batch_size=size)
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        read_mlperf_pair(tmp_path / "nowhere.json", performance)
