"""The repro of a run made in process (:func:`analysis.probe_callable`, ``bia experiment --hf``): no server to send to, so
``repro.py`` calls the engine itself, alone and in the run's batch. For transformers' own batching it loads the checkpoint
with transformers, through the very functions the run was probed with (their source is copied into the script, so it needs
torch and transformers, not bia); for a user's ``generate`` it imports it by its path, ``module:function``."""

from __future__ import annotations

import ast
import inspect
import json
import os
import pprint
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..run import Run
from ._case import ReproError

#: The engine name ``bia experiment --hf`` records: ``transformers 5.24.0 (padded batching)``.
_TRANSFORMERS = re.compile(r"transformers \S+ \((padded|continuous) batching\)")


def in_process(manifest: Mapping[str, Any]) -> bool:
    """Whether a run was made in process, by :func:`analysis.probe_callable` (``bia experiment --hf`` is one).

    Parameters
    ----------
    manifest : mapping
        The run's manifest.

    Returns
    -------
    bool

    Examples
    --------
    >>> in_process({"producer": "bia probe_callable"}), in_process({"producer": "bia probe"})
    (True, False)
    """
    return manifest.get("producer") == "bia probe_callable"


def engine_source(
    run: Run, folder: Path, *, checkpoint: str | os.PathLike[str] | None, generate: str | None
) -> dict[str, Any]:
    """What the script calls: the user's ``generate`` by its import path, or transformers on a checkpoint folder (bia's
    own ``.safetensors`` model is written as one into ``folder/checkpoint`` first).

    The checkpoint is ``checkpoint``, else the path the run's identity names when it exists, else the bundled model when
    the run names it (``tiny_lm``: the bundled transformers runs).

    Parameters
    ----------
    run : Run
        A run made in process.
    folder : path
        The repro's folder.
    checkpoint : str or path, optional
        A Hugging Face checkpoint folder, or bia's model (``.safetensors``).
    generate : str, optional
        ``module:function``: the ``generate(prompts)`` the run was probed with, importable where the script runs.

    Returns
    -------
    dict of str to Any
        ``generate``; or ``checkpoint`` (a folder: ``"checkpoint"``, beside the script, when written there), ``way``
        (``padded`` or ``continuous``) and ``top_k``.

    Raises
    ------
    ReproError
        A ``generate`` that is no ``module:function``, or a run whose engine or checkpoint is not known.
    """
    if generate is not None:
        if not re.fullmatch(r"[\w.]+:[\w.]+", generate):
            raise ReproError(f"--generate takes MODULE:FUNCTION (e.g. mypkg.engine:generate), got {generate!r}")
        return {"generate": generate}
    identity = run.manifest.get("identity") or {}
    way = _TRANSFORMERS.fullmatch(str(identity.get("engine") or ""))
    if way is None:
        raise ReproError(
            f"{run.label}: made in process by {identity.get('engine') or 'an unnamed engine'!r}, which bia cannot call "
            "again: give generate='module:function' (--generate), the generate it was probed with"
        )
    source = Path(checkpoint) if checkpoint is not None else _named_checkpoint(run, identity)
    if (
        source.is_file() and source.suffix == ".safetensors"
    ):  # bia's own model: written as a GPT-2 checkpoint, as the run's
        from ..experiment.engines import write_hf_checkpoint

        source = write_hf_checkpoint(source, folder / "checkpoint")
    if not (source / "config.json").is_file():
        raise ReproError(
            f"--checkpoint {source}: not a Hugging Face checkpoint folder (no config.json), nor bia's model"
        )
    top_k = (run.manifest.get("sampler") or {}).get("top_logprobs") or 5
    # the one written beside the script is named relative to it, so the folder can be moved or attached whole
    named = "checkpoint" if source == folder / "checkpoint" else str(source.resolve())
    return {"checkpoint": named, "way": way[1], "top_k": int(top_k)}


def _named_checkpoint(run: Run, identity: Mapping[str, Any]) -> Path:
    from ..experiment import bundled_model

    named = str((identity.get("model") or {}).get("path") or "")
    if named and Path(named).exists():
        return Path(named)
    if named == bundled_model().stem:  # bia experiment --hf data/tiny-model/tiny_lm.safetensors records the stem
        return bundled_model()
    raise ReproError(f"{run.label}: its checkpoint {named or '(unnamed)'!r} is not here: give it (--checkpoint PATH)")


def batch_prompts(run: Run, first: Mapping[str, Any]) -> tuple[str, list[str], int]:
    """The parting request's prompt, its batch's prompts in the order ``generate`` got them, and its row, from the run.

    Parameters
    ----------
    run : Run
        The run.
    first : mapping
        Its judgement's ``first_request``.

    Returns
    -------
    tuple of (str, list of str, int)

    Examples
    --------
    >>> from analysis import judge, read_run
    >>> run = read_run("data/transformers-cpu/padded")
    >>> prompt, batch, row = batch_prompts(run, judge(run).to_dicts()[0]["first_request"])
    >>> len(batch), row, batch[row] == prompt
    (4, 0, True)
    """
    import polars as pl

    texts = {p["prompt_id"]: p["text"] for p in run.manifest.get("prompts") or []}
    hit = run.prompt_run(first["prompt_id"]).dump.requests.filter(  # a streamed run's envelopes are with its pieces
        (pl.col("prompt_id") == first["prompt_id"])
        & (pl.col("c") == first["c"])
        & (pl.col("slot") == first["slot"])
        & pl.col("repeat").eq_missing(first["repeat"])
    )
    extra = json.loads(hit["extra"][0] or "{}") if hit.height else {}
    ids = extra.get("batch") or [first["prompt_id"]] * int(first["c"])  # copies: the envelope names no batch
    return texts[first["prompt_id"]], [texts[i] for i in ids], int(extra.get("batch_row", first["slot"]))


def inprocess_script_text(case: Mapping[str, Any], *, title: str) -> str:
    """``repro.py`` for a run made in process: ``CASE`` (the engine, the prompt, the batch and its row, the length, the
    tries) and a body that calls the engine alone and in the batch; exit 1 while the batched row parts, 0 when it does not,
    2 when the engine cannot be called. For transformers it holds the source of the functions the run was probed with.

    Parameters
    ----------
    case : mapping
        :func:`engine_source`'s fields and ``prompt``, ``batch``, ``row``, ``max_tokens``, ``tries``, ``precision``.
    title : str
        The docstring's first line.

    Returns
    -------
    str

    Examples
    --------
    >>> text = inprocess_script_text({"generate": "m:f", "prompt": "a", "batch": ["a", "a"], "row": 0, "max_tokens": 2,
    ...                               "tries": 1, "precision": "float32"}, title="a repro")
    >>> compile(text, "repro.py", "exec") is not None, "def transformers_engine" in text
    (True, True)
    """
    from ..experiment.engines import padded_generate

    adapters = inspect.getmodule(padded_generate)  # the module of transformers adapters the run was probed with
    assert adapters is not None

    engine = (
        f"transformers ({case['way']} batching) on {case['checkpoint']}" if "way" in case else f"{case['generate']}"
    )
    doc = (
        f'"""{title}\n\nCalls {engine} on the prompt alone, then on its batch of {len(case["batch"])}, and prints the first '
        "token where\nrow {row} parts from the call alone, with both logprobs and their bits. Exit 1: it still parts; 0: it "
        "does not;\n2: the engine cannot be called. "
        + (
            "Needs torch and transformers: python3 repro.py [--checkpoint DIR] [--tries N]\n"
            if "way" in case
            else "Run it where its module imports: python3 repro.py [--tries N]\n"
        )
        + '"""\n'
    ).replace("{row}", str(case["row"]))
    adapter = (
        f"# The module the run was probed with ({adapters.__name__}), as it was:\n"
        f"{_without_docstrings(inspect.getsource(adapters))}\n\n"
        if "way" in case
        else ""
    )
    literal = pprint.pformat(dict(case), width=120, sort_dicts=False)
    return (
        f"#!/usr/bin/env python3\n{doc}\nfrom __future__ import annotations\n\nCASE = {literal}\n{_BODY}\n\n{adapter}"
        'if __name__ == "__main__":\n    sys.exit(main())\n'
    )


def _without_docstrings(source: str) -> str:
    """A module's source less its docstrings (whose examples import bia, which the script does not need) and its
    ``from __future__`` line (the script has its own, first)."""
    spans = [
        (node.body[0].lineno, node.body[0].end_lineno or node.body[0].lineno)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    ]
    lines = source.splitlines(keepends=True)
    for start, end in sorted(spans, reverse=True):
        del lines[start - 1 : end]
    return "".join(line for line in lines if not line.startswith("from __future__"))


_BODY = r'''
import argparse
import importlib
import os
import struct
import sys
from pathlib import Path
from typing import Any


def user_engine():
    """The user's generate(prompts), imported by its path (the current folder first on the path)."""
    sys.path.insert(0, os.getcwd())
    module, _, name = CASE["generate"].partition(":")
    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def transformers_engine(checkpoint):
    """transformers' own batching on the checkpoint (a relative path is the script's folder's), as the run was probed (the
    functions below)."""
    model, tokenizer = load_checkpoint(Path(__file__).resolve().parent / checkpoint, dtype="float32", device="cpu")
    make = padded_generate if CASE["way"] == "padded" else continuous_generate
    return make(model, tokenizer, max_new_tokens=CASE["max_tokens"], top_k=CASE["top_k"])


def bits(value):
    """The logprob's bits at the run's precision (float32 by default), as hex."""
    return struct.pack(">d" if CASE["precision"] == "float64" else ">f", value).hex()


def steps(result):
    """Per token: (token id, logprob), then its top candidates (id, logprob) in order."""
    tops = result.get("top_logprobs") or [[] for _ in result["token_ids"]]
    return [((t, lp), [tuple(c) for c in top]) for t, lp, top in zip(result["token_ids"], result["logprobs"], tops)]


def first_difference(alone, other):
    """Where other first parts from alone: (token, None) for the chosen token, (token, rank) for a candidate; None when
    nothing parts (the values compared as the engine returned them, which is bit for bit)."""
    for position, (a, b) in enumerate(zip(alone, other)):
        if a[0] != b[0]:
            return position, None
        for rank, (x, y) in enumerate(zip(a[1], b[1])):
            if x != y:
                return position, rank
    return None if len(alone) == len(other) else (min(len(alone), len(other)), None)


def show(where, alone, other):
    position, rank = where

    def side(entries):
        if position >= len(entries):
            return "(ended)"
        token, logprob = entries[position][0] if rank is None else entries[position][1][rank]
        return f"token id {token} logprob {logprob!r} bits 0x{bits(logprob)}"

    what = "the chosen token" if rank is None else f"top_logprobs candidate {rank}"
    print(f"token {position}, {what}: alone   {side(alone)}")
    print(f"token {position}, {what}: batched (row {CASE['row']} of {len(CASE['batch'])}) {side(other)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if "way" in CASE:
        parser.add_argument("--checkpoint", default=CASE["checkpoint"], help="the checkpoint folder (default: the run's)")
    parser.add_argument("--tries", type=int, default=CASE["tries"], help="how many times to try; any part is a part")
    args = parser.parse_args()
    try:
        generate = transformers_engine(args.checkpoint) if "way" in CASE else user_engine()
        for attempt in range(1, args.tries + 1):
            alone = steps(generate([CASE["prompt"]])[0])
            other = steps(generate(list(CASE["batch"]))[CASE["row"]])
            where = first_difference(alone, other)
            if where is not None:
                print(f"PARTS (try {attempt} of {args.tries}): row {CASE['row']} of the batch parts from the prompt alone")
                show(where, alone, other)
                return 1
    except (ImportError, AttributeError, OSError, ValueError, TypeError, KeyError, IndexError) as exc:
        print(f"error: the engine could not be called: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(f"no part in {args.tries} tries: row {CASE['row']} of the batch matches the prompt alone, token for token and "
          f"bit for bit ({len(alone)} tokens)")
    return 0
'''
