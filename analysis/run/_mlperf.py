"""A run from an MLPerf Inference pair of accuracy logs: accuracy mode as the m=1 reference, performance mode batched.

MLPerf Inference asks a submitter to show that performance mode (the SUT batching for throughput) gives the outputs
of accuracy mode: compliance TEST01 (mlcommons/inference ``compliance/TEST01/verify_accuracy.py``) reruns performance
mode with loadgen logging a sample of its responses to a second ``mlperf_log_accuracy.json``, and sets each against
the accuracy log's entry of the same ``qsl_idx``, comparing the first element of each (an LLM's first token id). Here
the whole outputs are compared, as bia compares any run: :func:`read_mlperf_pair` builds a :class:`Run` whose reference
(ref #1, slot 0) of sample N, prompt ``qslN``, is the accuracy log's entry, and whose bands are the performance log's
entries of that sample, one band each (slot 0, among the other samples the SUT batched with it: the needle layout,
arm ``mixed``), ``repeat`` 0, 1, ... in the order the performance log lists them. How each log is decoded:
:mod:`analysis.dumps.formats._mlperf`.

What the logs cannot say, and how the run says it:

- **no logprobs**: every token's ``value_status`` is ``missing``, so :func:`analysis.judge` counts the matching
  batched requests as ``bits_unknown``: two logs that agree are UNVERIFIED, never GREEN (equal tokens are not equal bits);
- **no batch width**: loadgen does not log the batch a sample was decoded in, so no band is seen formed; ``batch_size``
  is the width the submitter states (the band's ``c``); without it, ``c`` is :data:`UNKNOWN_C`, which stands for "some
  batch above 1" and the run's label says so;
- **one decode alone per sample**: accuracy mode is the reference, but nothing shows the SUT repeats itself (no ref #2),
  nor that it decoded accuracy mode one sample at a time (a SUT may batch there too: the reference is then "accuracy
  mode", not m=1).

A sample in the performance log and not in the accuracy log is refused (accuracy mode runs every sample of the data
set, so the two logs are not a pair). A sample only in the accuracy log has nothing to compare with (loadgen logs only
a sample of performance mode's responses): its reference stays out of the run's frames, and the manifest's
``mlperf.reference_only`` lists its ``qsl_idx``. The judgement numbers every token of a run: with 512 of 24,576 samples
logged, the 24,064 others kept made :func:`analysis.judge` of the pair take 94 s and 8.9 GB rather than 5.2 s to 6.7 s
and 1.3 GB (``benchmarks/bench_mlperf.py --logged 512 --judge``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import polars as pl

from ..dumps import CANDIDATE_SCHEMA, Dump, DumpError, MlperfLog, read_mlperf_log
from ._layout import _DEFAULTS, _checked_manifest
from ._model import Run

UNKNOWN_C = 2  # the band c of a performance log whose batch size is not given: the least batch that batches anything


def read_mlperf_pair(
    accuracy_log: str | os.PathLike[str],
    performance_log: str | os.PathLike[str],
    *,
    dtype: str = "int64",
    batch_size: int | None = None,
) -> Run:
    """Read an MLPerf Inference accuracy-mode and performance-mode ``mlperf_log_accuracy.json`` as one run.

    The accuracy log is each sample's m=1 reference (ref #1); each entry of the performance log is a batched request
    of its sample (role ``band``, slot 0, ``repeat`` its rank among the sample's entries in that log). A sample is the
    prompt ``qslN`` (N its ``qsl_idx``). The logs hold token ids only: the judgement compares tokens, and a pair that
    agrees is UNVERIFIED (bits unknown), never GREEN; a pair that parts is RED, naming the sample and the token.

    Parameters
    ----------
    accuracy_log, performance_log : path
        loadgen's accuracy log of an accuracy-mode run, and of a performance-mode run with accuracy logging
        (``accuracy_log_sampling_target`` or ``accuracy_log_probability``, as compliance TEST01 sets them).
    dtype : {"int64", "int32"}
        The width the SUT wrote its token ids in (little-endian), as the benchmark's evaluation script's ``--dtype``.
    batch_size : int, optional
        The performance run's batch size, the bands' ``c`` (1: performance mode decoded each sample alone, which the
        judgement holds to run-to-run reproducibility). Without it the bands' ``c`` is ``UNKNOWN_C`` (2), "batched at
        some c > 1", and the run's label says the batch size is unknown.

    Returns
    -------
    Run
        Requests with ``prompt_id``, ``role``, ``c``, ``slot``, ``repeat`` and ``sample_key`` (the ``qsl_idx``),
        ``request_id`` (the ``seq_id``), for every performance-log entry and the accuracy-log entry of each of its samples;
        the manifest's ``mlperf`` records the files, dtype, batch size, counts, and the samples only the accuracy log
        holds (``reference_only``, their ``qsl_idx``), which stay out of the run.

    Raises
    ------
    DumpError
        A log that is not loadgen's shape (naming the file, the entry and the field), or a performance-log sample
        missing from the accuracy log, or a sample the accuracy log holds twice.

    Examples
    --------
    >>> import json, tempfile, numpy as np
    >>> from pathlib import Path
    >>> from analysis import judge
    >>> def log(path, outputs):  # loadgen's entries, each output's token ids as the hex of their int64 bytes
    ...     path.write_text(json.dumps([{"seq_id": k, "qsl_idx": k, "data": np.array(ids, np.int64).tobytes().hex()}
    ...                                 for k, ids in enumerate(outputs)]))
    ...     return path
    >>> with tempfile.TemporaryDirectory() as folder:
    ...     run = read_mlperf_pair(log(Path(folder, "acc.json"), [[5, 6, 7], [8, 9]]), log(Path(folder, "perf.json"), [[5, 6, 7], [8, 4]]),
    ...                            batch_size=8)
    >>> print(judge(run).frame["first"][0])
    qsl1 c=8 repeat 0 slot 0: its tokens part at token 1
    """
    c = _batch_c(batch_size)
    if (
        os.path.exists(accuracy_log)
        and os.path.exists(performance_log)
        and os.path.samefile(accuracy_log, performance_log)
    ):
        raise ValueError(
            f"{os.fspath(performance_log)}: the same file as the accuracy log; pass a performance run's log"
        )  # one source, two roles
    reference, batched = read_mlperf_log(accuracy_log, dtype), read_mlperf_log(performance_log, dtype)
    _check_references(reference)
    repeats = _check_batched(batched, reference)
    compared = reference.subset(
        np.isin(reference.qsl_idx, batched.qsl_idx)
    )  # the others are listed in the manifest, not judged
    return Run(
        _manifest(reference, compared, batched, dtype, batch_size, c), _dump(compared, batched, repeats, c), None
    )


def _dump(references: MlperfLog, batched: MlperfLog, repeats: np.ndarray, c: int) -> Dump:
    """Both logs' frames, each request placed: a reference as ref #1 of its sample, a batched entry as a band of c."""
    ref_tokens, ref_requests = references.frames()
    tokens, requests = batched.frames()
    ref_requests = ref_requests.with_columns(
        prompt_id=_prompts(references), role=pl.lit("reference"), slot=pl.lit(0, pl.Int64)
    )
    requests = requests.with_columns(
        prompt_id=_prompts(batched),
        role=pl.lit("band"),
        c=pl.lit(c, pl.Int64),
        slot=pl.lit(0, pl.Int64),
        repeat=pl.Series(repeats, dtype=pl.Int64),
    )
    return Dump(
        pl.concat([ref_tokens, tokens]),
        pl.DataFrame(schema=CANDIDATE_SCHEMA),
        pl.concat([ref_requests, requests]),
        {references.source: [MlperfLog.FORMAT], batched.source: [MlperfLog.FORMAT]},
        [],
    )


def _batch_c(batch_size: Any) -> int:
    if batch_size is None:
        return UNKNOWN_C
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(
            f"batch_size must be an integer >= 1 (the performance run's batch size) or None, got {batch_size!r}"
        )
    return batch_size


def _prompts(log: MlperfLog) -> pl.Series:
    return pl.Series("prompt_id", np.char.add("qsl", log.qsl_idx.astype(str)), dtype=pl.String)


def _check_references(log: MlperfLog) -> None:
    """Accuracy mode decodes each sample once: a sample twice has two references, and which is m=1 is not known."""
    first = _first_entries(log.qsl_idx)
    again = np.flatnonzero(first != np.arange(len(first)))
    if again.size:
        k = int(again[0])
        raise DumpError(
            log.source,
            f"entry {k}",
            "qsl_idx",
            f"sample {log.qsl_idx[k]} again (first at entry {first[k]}): an accuracy-mode "
            "log holds each sample once, its reference",
        )


def _check_batched(batched: MlperfLog, reference: MlperfLog) -> np.ndarray:
    """Each performance-log entry's repeat (its rank among its sample's entries), once every sample has a reference."""
    if not len(batched.qsl_idx):
        raise DumpError(
            batched.source,
            "$",
            None,
            "no entries: loadgen logs performance mode's responses only when asked to "
            "(accuracy_log_sampling_target or accuracy_log_probability, as TEST01's audit.config)",
        )
    absent = np.flatnonzero(~np.isin(batched.qsl_idx, reference.qsl_idx))
    if absent.size:
        k = int(absent[0])
        raise DumpError(
            batched.source,
            f"entry {k}",
            "qsl_idx",
            f"sample {batched.qsl_idx[k]} is not in the accuracy log {reference.source}, "
            "which holds every sample accuracy mode ran: the two logs are not a pair",
        )
    ranks = pl.DataFrame({"q": batched.qsl_idx}).select(pl.int_range(pl.len()).over("q"))
    return ranks.to_series().to_numpy().astype(np.int64)


def _first_entries(qsl_idx: np.ndarray) -> np.ndarray:
    """For each entry, the index of the first entry of its sample."""
    _, first, inverse = np.unique(qsl_idx, return_index=True, return_inverse=True)
    return first[inverse]


def _manifest(
    reference: MlperfLog, compared: MlperfLog, batched: MlperfLog, dtype: str, batch_size: int | None, c: int
) -> dict[str, Any]:
    label = f"{batched.source} against {reference.source}"
    if batch_size is None:
        label += f" (batch size unknown: c={c} stands for any batch above 1)"
    alone = np.sort(reference.qsl_idx[~np.isin(reference.qsl_idx, compared.qsl_idx)])
    mlperf = {
        "accuracy_log": reference.source,
        "performance_log": batched.source,
        "dtype": dtype,
        "batch_size": batch_size,
        "reference_entries": len(reference.qsl_idx),
        "performance_entries": len(batched.qsl_idx),
        "samples_compared": len(compared.qsl_idx),
        "reference_only": alone.tolist(),
    }
    manifest = {
        **_DEFAULTS,
        "ladder": [c],
        "label": label,
        "producer": "MLPerf Inference loadgen",
        "requested": {"layout": "needle"},
        "complete": True,
        "mlperf": mlperf,
    }
    return _checked_manifest(manifest, "manifest")
