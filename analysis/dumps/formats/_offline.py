"""vLLM's offline API: ``RequestOutput.outputs[k].logprobs``, a list with one dict per step,
``token_id -> Logprob(logprob, rank, decoded_token)``, the sampled token first and -inf not clamped.

Read from a printed Python repr (parsed with ``ast``, never evaluated) or from the same data as
JSON (``[{"785": {"logprob": 0.0, "rank": 1, "decoded_token": "The"}, ...}, ...]``).
"""

from __future__ import annotations

import ast
import math
from typing import Any

from .._kit import Meta, _obj
from .._schema import Rows
from .._values import DumpError

_NAMES = {"inf": math.inf, "nan": math.nan, "None": None, "True": True, "False": False}


def _literal(node: ast.AST, source: str) -> Any:
    """The value of a repr's node: literals, lists, dicts, ``Logprob(...)`` calls and inf/nan; nothing else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _literal(node.operand, source)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List):
        return [_literal(item, source) for item in node.elts]
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal(k, source): _literal(v, source) for k, v in zip(node.keys, node.values) if k is not None}
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Logprob" and not node.args:
        return {kw.arg: _literal(kw.value, source) for kw in node.keywords}
    raise DumpError(
        source,
        f"line {getattr(node, 'lineno', '?')}",
        None,
        f"unexpected Python syntax in a logprobs repr: {ast.dump(node)[:60]}",
    )


def parse_repr(text: str, source: str) -> list:
    """The steps of a printed ``list[dict[int, Logprob]]``.

    Parameters
    ----------
    text : str
        The printed list (``#`` comment lines are ignored).
    source : str
        The source's name, for error messages.

    Returns
    -------
    list of dict

    Examples
    --------
    >>> parse_repr("[{7: Logprob(logprob=-inf, rank=2, decoded_token='a')}]", "s")
    [{7: {'logprob': -inf, 'rank': 2, 'decoded_token': 'a'}}]
    """
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    try:
        tree = ast.parse(body.strip(), mode="eval")
    except SyntaxError as exc:
        raise DumpError(
            source, f"line {exc.lineno}", None, f"not a complete Python repr of logprobs: {exc.msg}"
        ) from None
    return _literal(tree.body, source)


def looks_like_steps(payload: Any) -> bool:
    """A JSON list of per-step dicts keyed by token ids whose values hold a logprob.

    Parameters
    ----------
    payload : object
        The parsed JSON document.

    Returns
    -------
    bool
    """
    if not isinstance(payload, list) or not payload:
        return False
    first = next((step for step in payload if step is not None), None)
    if not isinstance(first, dict) or not first:
        return False
    key, value = next(iter(first.items()))
    return str(key).lstrip("-").isdigit() and isinstance(value, dict) and "logprob" in value


_MODES = {
    "raw_logprobs": ("logprob", "raw"),
    "processed_logprobs": ("logprob", "processed"),
    "raw_logits": ("logit", "raw"),
    "processed_logits": ("logit", "processed"),
    None: ("logprob", "unknown"),
}


def logprobs_mode(mode: Any, rows: Rows, where: str) -> tuple[str, str]:
    """(value_kind, logprob_semantics) for vLLM's ``--logprobs-mode``; logits are kept raw, never as logprobs.

    Parameters
    ----------
    mode : object
        The ``logprobs_mode`` the capture recorded (None: not recorded).
    rows : Rows
        The rows being built (for the source's name in errors).
    where : str
        Where the value is in the source, for error messages.

    Returns
    -------
    tuple of (str, str)
    """
    if mode not in _MODES:
        raise DumpError(
            rows.source, where, "logprobs_mode", f"expected one of {sorted(m for m in _MODES if m)}, got {mode!r}"
        )
    return _MODES[mode]


def parse_offline(steps: Any, rows: Rows, meta: Meta, where: str = "$") -> None:
    """Append one completion from its per-step dicts; the first entry of each step is the sampled token.

    Parameters
    ----------
    steps : object
        The list of per-step dicts ``{token_id: {logprob, rank, decoded_token}}``.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context (``extra["logprobs_mode"]`` says what the values are).
    where : str, default "$"
        Where the list is in the source, for error messages.
    """
    if not isinstance(steps, list):
        raise DumpError(rows.source, where, None, "expected a list of per-step dicts")
    kind, semantics = logprobs_mode(meta.extra.get("logprobs_mode"), rows, where)
    for t, step in enumerate(steps):
        swhere = f"{where}[{t}]"
        step = _obj(step, rows, swhere)
        if not step:
            raise DumpError(rows.source, swhere, None, "an empty step")
        entries = []
        for token_key, info in step.items():
            if isinstance(token_key, bool) or not str(token_key).lstrip("-").isdigit():
                raise DumpError(rows.source, swhere, str(token_key), "expected a token id as the key")
            info = _obj(info, rows, f"{swhere}.{token_key}")
            entries.append(
                {
                    "token_id": int(token_key),
                    "token_text": info.get("decoded_token"),
                    "raw": info.get("logprob"),
                    "vocab_rank": info.get("rank"),
                }
            )
        first = entries[0]
        key = (meta.record, 0, "completion", t)
        rows.token(
            key,
            swhere,
            raw=first["raw"],
            kind=kind,
            sample_key=meta.sample_key,
            token_id=first["token_id"],
            token_text=first["token_text"],
            vocab_rank=first["vocab_rank"],
            n_candidates=len(entries),
            logprob_semantics=semantics,
        )
        rows.candidates_for(
            key, swhere, entries, list_kind="top_logprobs", sampled_id=first["token_id"], sampled_text=None, kind=kind
        )
    rows.request(
        **meta.request_columns(),
        choice_index=0,
        endpoint="offline",
        stream=False,
        n_prompt_scored=0,
        n_completion_scored=len(steps),
        extra=meta.extra,
    )
