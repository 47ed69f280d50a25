"""The first op that differs: for every batched decode step whose outputs differ from m=1, the first
op, in forward order, whose output differs bit for bit from the same request decoded alone.

:func:`write_first_ops` replays an experiment run (its prompts, ladder, layout and kernel mode, read
from its manifest) with :mod:`._taps` open, after the timed decode, so that the taps never slow the
decode rates the run records. The m=1 reference is replayed first and every op's output kept; each
band is then replayed with every recorded row's ops compared, as they come, with the reference's at
the same step (each dimension aligned on its last entries: left padding and padded keys fall away).
The replay must give the run's tokens and float32 logprobs bit for bit, or nothing is written.

A step differs when its token, logprob or top-k differ from m=1's at that step (what the run's
tables compare); its first op is the first tapped op whose output differs, or ``logprobs`` (the
float32 log-softmax and top-k of :func:`._decode.step_outputs`) when the logits are bit-identical. In a
kernel mode whose decode does not run the whole batch through ``TinyLM.forward`` once per step
(``one-by-one``, ``fixed-tiles``, a Hugging Face model), the taps cannot pair a row with its
reference: differing steps are still listed, with no op, and the file says ``"tapped": false``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from ...run import read_run
from .._common import ExperimentError, bundled_model, experiment_batch, weights_sha256
from ._decode import decode
from ._model import load_model
from ._taps import Taps, tapped_ops

FIRST_OPS_FILE = "first_ops.json"
FIRST_OPS_VERSION = 2  # 2: the steps name concurrency c (1 named it band_c, read as legacy)
_INTS = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bits as integers of its width: -0.0 and 0.0 differ, a NaN equals the same NaN."""
    return t.view(_INTS[t.element_size()]) if t.is_floating_point() else t


class _Reference:
    """Every op's output at every forward call of one request decoded alone."""

    def __init__(self) -> None:
        self.calls: list[dict[int, torch.Tensor]] = []

    def __call__(self, call: int, op: int, value: torch.Tensor) -> None:
        if call == len(self.calls):
            self.calls.append({})
        self.calls[call][op] = value.detach()


class _Comparison:
    """Whether each recorded row's op output differs from the reference's at the same call, op by op."""

    def __init__(self, reference: _Reference, batch: int, rows: list[int], n_ops: int) -> None:
        self.reference, self.batch, self.n_ops = reference, batch, n_ops
        self.rows = torch.tensor(rows)
        self.differs: dict[int, torch.Tensor] = {}  # per call: [ops, rows]
        self.paired = True  # every op saw the whole batch and met a reference output it can be aligned with

    def __call__(self, call: int, op: int, value: torch.Tensor) -> None:
        ref = self.reference.calls[call].get(op) if call < len(self.reference.calls) else None
        if (
            ref is None
            or value.shape[0] != self.batch
            or value.dim() != ref.dim()
            or any(m < r for m, r in zip(value.shape[1:], ref.shape[1:]))
        ):
            self.paired = False  # a call of another shape than the batch's (a mode that runs rows alone): no pairing
            return
        mine = value.detach()[self.rows.to(value.device)]
        self.differs.setdefault(call, torch.zeros(self.n_ops, len(self.rows), dtype=torch.bool))
        # left padding (queries, keys) comes first in every dimension: the row's own entries are the last ones
        aligned = mine[(slice(None), *(slice(m - r, None) for m, r in zip(mine.shape[1:], ref.shape[1:])))]
        self.differs[call][op] = (_bits(aligned) != _bits(ref)).reshape(len(self.rows), -1).any(dim=1).cpu()


def _outputs(decoded: list) -> tuple[np.ndarray, ...]:
    """Tokens, float32 logprob bits, top-k ids and top-k logprob bits of requests, as arrays [requests, steps, ...]."""

    def bits(values):
        return np.asarray(values, dtype=np.float32).view(np.int32)

    return (
        np.asarray([d.token_ids for d in decoded]),
        bits([d.logprobs for d in decoded]),
        np.asarray([d.top_ids for d in decoded]),
        bits([d.top_logprobs for d in decoded]),
    )


def steps_that_differ(rows: list, reference) -> np.ndarray:
    """``[rows, steps]``: whether each row's token, logprob or top-k at each step differ from the reference's, bit for bit.

    Parameters
    ----------
    rows : list of Decoded
        The batch rows' decodes.
    reference : Decoded
        The m=1 decode of the same prompt.

    Returns
    -------
    numpy.ndarray
        Booleans, ``[rows, steps]``.

    Examples
    --------
    >>> from analysis.experiment.model import Decoded
    >>> alone = Decoded([1], [5, 6], [-0.5, -0.25], [[5], [6]], [[-0.5], [-0.25]])
    >>> drifted = Decoded([1], [5, 6], [-0.5, -0.2500001], [[5], [6]], [[-0.5], [-0.2500001]])
    >>> steps_that_differ([alone, drifted], alone).tolist()
    [[False, False], [False, True]]
    """
    mine, ref = _outputs(rows), _outputs([reference])
    differs = np.zeros(mine[0].shape, dtype=bool)
    for m, r in zip(mine, ref):
        differs |= (m != r).reshape(*m.shape[:2], -1).any(axis=-1)
    return differs


def _tapped_decode(model, prompts: list[list[int]], sink, *, mode: str, max_tokens: int, top_k: int):
    """The decode of ``prompts`` with every op tapped; its outputs, and whether it ran one forward call per step with every row."""
    try:
        taps = Taps(model, sink)
    except AttributeError:  # not bia's TinyLM: no op to tap
        return decode(model, prompts, mode=mode, max_tokens=max_tokens, top_k=top_k), False
    with taps:
        outs = decode(model, prompts, mode=mode, max_tokens=max_tokens, top_k=top_k)
    return outs, taps.calls + 1 == max_tokens and taps.rows == [len(prompts)] * max_tokens


def band_first_ops(
    model,
    reference: tuple[list, _Reference, bool],
    batch: list[list[int]],
    rows: list[int],
    *,
    mode: str,
    max_tokens: int,
    top_k: int,
) -> tuple[list, dict[str, np.ndarray], bool]:
    """One band replayed with taps: its outputs, its differing steps with their first op, and whether the ops were tapped.

    ``reference`` is :func:`reference_taps`' result for the band's target prompt; ``rows`` the batch
    rows decoded from that prompt whose steps are recorded. The steps come as columns ``row`` (the
    index in ``rows``), ``step`` and ``op_index`` (in :func:`._taps.tapped_ops` order, one past
    the last op for ``logprobs``; -1 where the ops were not tapped).

    Parameters
    ----------
    model : TinyLM or HFModel
        The model.
    reference : tuple
        What :func:`reference_taps` gave for the target prompt.
    batch : list of list of int
        The band's rows, as token ids.
    rows : list of int
        The batch rows decoded from the target prompt whose steps are recorded.
    mode : str
        The kernel mode.
    max_tokens : int
        Greedy tokens decoded per request.
    top_k : int
        Candidates recorded per step.

    Returns
    -------
    tuple of (list of Decoded, dict of str to numpy.ndarray, bool)
    """
    (alone,), kept, ref_tapped = reference
    n_ops = len(tapped_ops(len(model.blocks))) if hasattr(model, "blocks") else 0
    comparison = _Comparison(kept, len(batch), rows, n_ops)
    outs, tapped = _tapped_decode(model, batch, comparison, mode=mode, max_tokens=max_tokens, top_k=top_k)
    tapped = tapped and ref_tapped and comparison.paired
    differs = steps_that_differ([outs[r] for r in rows], alone)
    row, step = np.nonzero(differs)
    if tapped:
        ops = (
            torch.stack([comparison.differs[call] for call in range(max_tokens)]).permute(2, 0, 1).numpy()
        )  # [rows, steps, ops]
        at = ops[row, step]
        op_index = np.where(at.any(axis=1), at.argmax(axis=1), n_ops)
    else:
        op_index = np.full(row.shape, -1)
    return outs, {"row": row, "step": step, "op_index": op_index}, tapped


def reference_taps(
    model, prompt: list[int], *, mode: str, max_tokens: int, top_k: int
) -> tuple[list, _Reference, bool]:
    """The m=1 decode of ``prompt`` with every op's output kept, for :func:`band_first_ops`.

    Parameters
    ----------
    model : TinyLM or HFModel
        The model.
    prompt : list of int
        The prompt, as token ids.
    mode : str
        The kernel mode.
    max_tokens : int
        Greedy tokens decoded.
    top_k : int
        Candidates recorded per step.

    Returns
    -------
    tuple
        The decode's outputs, the ops' outputs kept, and whether they were tapped.
    """
    kept = _Reference()
    outs, tapped = _tapped_decode(model, [prompt], kept, mode=mode, max_tokens=max_tokens, top_k=top_k)
    return outs, kept, tapped


def write_first_ops(
    run_dir: str | Path,
    *,
    model=None,
    model_path: str | Path | None = None,
    advance: Callable[[int], Any] | None = None,
) -> Path:
    """Replay an experiment run with taps on every op and write ``first_ops.json`` into it.

    Parameters
    ----------
    run_dir : path
        A run directory written by :func:`analysis.run_experiment` (any kernel mode, either layout).
    model : TinyLM, optional
        The model the run decoded, already loaded (as :func:`analysis.run_experiment` passes it).
    model_path : path, optional
        Otherwise the weights to load: by default the bundled model. Its sha256 must be the one the
        manifest records.
    advance : callable, optional
        Called with the number of sequences replayed after each band (a progress bar's ``update``).

    Returns
    -------
    Path
        The file written, which :func:`analysis.first_op_table` reads.

    Raises
    ------
    ExperimentError
        The run is not an experiment's, the weights are not the run's, or the replay does not give
        the run's tokens and logprobs bit for bit (another torch build, thread count or machine).

    Examples
    --------
    >>> import tempfile
    >>> from analysis import run_experiment
    >>> (run,) = run_experiment(tempfile.mkdtemp(), prompts=["Hi"], ladder=[2], modes=["default"], max_tokens=4, taps=False)
    >>> write_first_ops(run).name
    'first_ops.json'
    """
    step = advance or (lambda n: None)
    run_dir = Path(run_dir)
    run = read_run(run_dir)
    s = _settings(run_dir, run.manifest, ExperimentError)
    threads = torch.get_num_threads()
    torch.set_num_threads(s["threads"] or threads)  # the BLAS's summation order may follow its thread count
    torch.manual_seed(s["seed"])
    try:
        model = model if model is not None else _load(run_dir, run.manifest, model_path, s, ExperimentError)
        encoded = [model.encode(p) for p in s["prompts"]]
        columns: dict[str, list] = {name: [] for name in ("prompt_id", "c", "slot", "step", "op_index")}
        replayed, tapped = [], True
        for index, prompt in enumerate(encoded):
            pid = f"p{index}"
            reference = reference_taps(model, prompt, mode=s["mode"], max_tokens=s["max_tokens"], top_k=s["top_k"])
            replayed.append((f"{pid}-ref1", reference[0][0]))
            step(1)
            rng = random.Random(s["seed"] + index)  # the experiment's needle positions, band after band
            for c in s["ladder"]:
                batch, target = experiment_batch(prompt, encoded, c, s["layout"], rng)
                rows = list(range(c)) if s["layout"] == "copies" else [target]
                outs, found, band_tapped = band_first_ops(
                    model, reference, batch, rows, mode=s["mode"], max_tokens=s["max_tokens"], top_k=s["top_k"]
                )
                tapped &= band_tapped
                replayed += [(f"{pid}-c{c}-s{slot}", outs[row]) for slot, row in enumerate(rows)]
                n = len(found["step"])
                columns["prompt_id"] += [pid] * n
                columns["c"] += [c] * n
                columns["slot"] += found["row"].tolist()
                columns["step"] += found["step"].tolist()
                columns["op_index"] += found["op_index"].tolist()
                step(c)
    finally:
        torch.set_num_threads(threads)
    _check_replay(run_dir, run, replayed, ExperimentError)
    return _write(run_dir, s["mode"], model, columns, tapped)


def _settings(run_dir: Path, manifest: dict[str, Any], error: type[Exception]) -> dict[str, Any]:
    """What the replay needs from an experiment's manifest; ``error`` names the field that is missing."""
    if manifest.get("producer") != "bia experiment":
        raise error(
            f"{run_dir}: not a run of bia experiment (producer {manifest.get('producer')!r}); only its decode can be replayed"
        )
    try:
        requested, sampler = manifest["requested"], manifest["sampler"]
        return {
            "prompts": [p["text"] for p in manifest["prompts"]],
            "ladder": [int(c) for c in manifest["ladder"]],
            "mode": requested["kernel_mode"],
            "layout": requested.get("layout", "copies"),
            "max_tokens": int(sampler["max_tokens"]),
            "top_k": int(sampler["top_logprobs"]),
            "seed": int(sampler["seed"]),
            "dtype": manifest["effective"]["dtype"],
            "device": manifest["effective"]["device"],
            "threads": (manifest.get("environment") or {}).get("threads"),
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise error(
            f"{run_dir / 'manifest.json'}: field {exc} missing or malformed; the decode cannot be replayed"
        ) from None


def _load(run_dir: Path, manifest: dict[str, Any], model_path, s: dict[str, Any], error: type[Exception]):
    path = Path(model_path) if model_path else bundled_model()
    recorded = ((manifest.get("identity") or {}).get("model") or {}).get("sha256")
    if weights_sha256(path) != recorded:
        raise error(
            f"{run_dir}: the model {path} is not the one the run decoded (its manifest's identity.model.sha256 is {recorded})"
        )
    return load_model(path, {"float32": torch.float32, "bfloat16": torch.bfloat16}[s["dtype"]], s["device"])


def _check_replay(run_dir: Path, run, replayed: list[tuple[str, Any]], error: type[Exception]) -> None:
    """Refuse a replay whose tokens or float32 logprobs are not the captured ones, bit for bit."""
    ours = pl.DataFrame(
        {
            "request_id": [r for r, _ in replayed],
            "token_id": [d.token_ids for _, d in replayed],
            "logprob": [d.logprobs for _, d in replayed],
        }
    ).explode("token_id", "logprob")
    ours = ours.with_columns(position=pl.int_range(pl.len()).over("request_id"))
    captured = run.dump.tokens.join(
        run.dump.requests.select("source", "record", "choice_index", "request_id"),
        on=["source", "record", "choice_index"],
    ).select("request_id", "position", "token_id", "logprob")
    both = ours.join(captured, on=["request_id", "position"], how="left", suffix="_captured")
    bad = both.filter(
        (pl.col("token_id") != pl.col("token_id_captured")).fill_null(True)
        | (pl.col("logprob").cast(pl.Float32) != pl.col("logprob_captured").cast(pl.Float32)).fill_null(True)
    )
    if bad.height:
        first = bad.row(0, named=True)
        raise error(
            f"{run_dir}: the replay of request {first['request_id']} differs from its capture at token {first['position']} "
            f"(token {first['token_id']}, logprob {first['logprob']!r}; captured {first['token_id_captured']}, "
            f"{first['logprob_captured']!r}): replay it where it was decoded (same torch, threads and machine)"
        )


def _write(run_dir: Path, mode: str, model, columns: dict[str, list], tapped: bool) -> Path:
    ops = [*(tapped_ops(len(model.blocks)) if hasattr(model, "blocks") else []), (None, "logprobs")]
    index = np.asarray(columns.pop("op_index"), dtype=np.int64)
    # one past the ops is None: the op index -1 (not tapped) names no layer and no op
    columns["layer"] = np.array([layer for layer, _ in ops] + [None], dtype=object)[index].tolist()
    columns["op"] = np.array([op for _, op in ops] + [None], dtype=object)[index].tolist()
    record = {
        "first_ops_version": FIRST_OPS_VERSION,
        "producer": "bia experiment",
        "kernel_mode": mode,
        "tapped": tapped,
        "what": "per batched decode step whose token, logprob or top-k differ from m=1 bit for bit, the first op in forward order "
        "whose output differs from the same step of the request decoded alone (op null: this mode's kernels have no taps)",
        "ops": [{"layer": layer, "op": op} for layer, op in ops],
        "steps": columns,
    }
    path = run_dir / FIRST_OPS_FILE
    path.write_text(json.dumps(record, separators=(",", ":")) + "\n")
    return path
