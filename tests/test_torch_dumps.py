"""torch dumps: log-softmax and top-k worked by hand, EOS masking, and weights_only refusal."""

from __future__ import annotations

import math
import pickle

import pytest

from conftest import serve_folder

from analysis import DumpError, read_dump

torch = pytest.importorskip("torch")


def logsumexp(values):
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def test_full_scores_reduced_by_hand(tmp_path):
    # one row, prompt [9, 9], two steps over a vocabulary of 4
    step0 = [2.0, 1.0, 0.0, -1.0]
    step1 = [0.0, 3.0, 3.0, float("-inf")]  # a tie at the top, and a token the processors masked
    dump = {"sequences": torch.tensor([[9, 9, 1, 2]]), "scores": [torch.tensor([step0]), torch.tensor([step1])], "model": "tiny"}
    path = tmp_path / "gen.pt"
    torch.save(dump, path)
    d = read_dump(path, torch_options={"top_k": 3})
    assert d.formats[str(path)] == ["torch"]
    t = d.tokens
    assert t["token_id"].to_list() == [1, 2]
    expected0 = 1.0 - logsumexp(step0)
    expected1 = 3.0 - logsumexp(step1[:3])
    assert t["logprob"].to_list() == pytest.approx([expected0, expected1], abs=1e-6)
    assert t["vocab_rank"].to_list() == [2, 1]  # token 1 is second at step 0; tied for first at step 1
    assert t["logprob_semantics"].to_list() == ["processed", "processed"]
    c = d.candidates.filter(position=0)
    assert c["cand_token_id"].to_list() == [0, 1, 2]
    assert c["is_sampled"].to_list() == [False, True, False]
    assert c["cand_vocab_rank"].to_list() == [1, 2, 3]
    assert d.requests.select("model", "finish_reason", "completion_tokens").row(0) == ("tiny", "length", 2)


def test_rows_stop_after_their_eos(tmp_path):
    scores = torch.zeros(2, 3, 5)
    dump = {"sequences": torch.tensor([[7, 4, 0, 0], [7, 1, 2, 3]]), "logits": scores, "eos_token_id": 4, "prompt_length": 1}
    path = tmp_path / "eos.pt"
    torch.save(dump, path)
    d = read_dump(path)
    assert d.tokens.filter(choice_index=0)["token_id"].to_list() == [4]
    assert d.tokens.filter(choice_index=1)["token_id"].to_list() == [1, 2, 3]
    assert d.requests["finish_reason"].to_list() == ["eos", "length"]
    assert d.tokens["logprob"].to_list() == pytest.approx([-math.log(5)] * 4)
    assert d.tokens["logprob_semantics"].unique().to_list() == ["raw"]


def test_reduced_top_k_dump(tmp_path):
    dump = {"token_ids": torch.tensor([[5, 6]]), "top_ids": torch.tensor([[[5, 1], [2, 3]]]),
            "top_logprobs": torch.tensor([[[-0.1, -2.5], [-0.2, -1.0]]], dtype=torch.bfloat16)}
    path = tmp_path / "reduced.pt"
    torch.save(dump, path)
    t = read_dump(path).tokens
    assert t["value_status"].to_list() == ["ok", "missing"]  # 6 is not in its row's top 2, and no own logprob was saved
    assert t["logprob"][0] == pytest.approx(-0.1, abs=1e-3)


def test_weights_only_refuses_arbitrary_objects(tmp_path, capfd):
    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    path = tmp_path / "evil.pt"
    with open(path, "wb") as handle:
        pickle.dump({"sequences": Payload()}, handle)
    with pytest.raises(DumpError, match="not loadable with torch.load\\(weights_only=True\\)"):
        read_dump(path, format="torch")
    assert "this must never run" not in capfd.readouterr().out


def test_shape_errors(tmp_path):
    path = tmp_path / "bad.pt"
    torch.save({"sequences": torch.tensor([[1, 2]]), "scores": torch.zeros(2, 1, 4)}, path)
    with pytest.raises(DumpError, match="scores: has 2 rows but sequences has 1"):
        read_dump(path)


def test_torch_dump_from_a_loopback_url(tmp_path, monkeypatch):
    torch.save({"token_ids": torch.tensor([[5]]), "top_ids": torch.tensor([[[5, 1]]]), "top_logprobs": torch.tensor([[[-0.5, -1.0]]])}, tmp_path / "r.pt")
    monkeypatch.setenv("BIA_CACHE_DIR", str(tmp_path / "cache"))
    with serve_folder(tmp_path) as base:
        d = read_dump(f"{base}/r.pt")
    assert d.tokens["logprob"].to_list() == [-0.5]
    assert list(d.formats.values()) == [["torch"]]
