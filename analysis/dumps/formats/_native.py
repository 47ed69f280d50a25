"""Engines' own shapes: SGLang ``meta_info``, llama.cpp ``/completion``, TGI ``details``, and
prime-rl's token export lines."""

from __future__ import annotations

from typing import Any

from .._kit import Meta, _int_or_none, _list, _obj, add_entry
from .._schema import Rows
from .._values import DumpError

# --- SGLang ----------------------------------------------------------------------------------------


def _triple(value: Any, rows: Rows, where: str) -> tuple[Any, int | None, str | None]:
    """SGLang's ``[logprob, token_id, text|null]``, or lmdeploy's ``[logprob, token_id]`` pair (its text unknown).

    Examples
    --------
    >>> _triple([-0.5, 7, "a"], None, "$"), _triple([-0.5, 7], None, "$")
    ((-0.5, 7, 'a'), (-0.5, 7, None))
    """
    if not isinstance(value, list) or len(value) not in (2, 3):
        raise DumpError(
            rows.source,
            where,
            None,
            f"expected [logprob, token_id, text|null] or [logprob, token_id], got {value!r:.80}",
        )
    logprob, token_id, text = value if len(value) == 3 else (*value, None)
    _int_or_none(token_id, rows, where, "[1] token_id", token_id=True)
    if text is not None and not isinstance(text, str):
        raise DumpError(rows.source, where, "[2] text", f"expected a string or null, got {text!r}")
    return logprob, token_id, text


def parse_sglang(payload: Any, rows: Rows, meta: Meta, where: str = "$") -> None:
    """SGLang ``/generate``: ``meta_info.{input,output}_token_logprobs`` triples and their top lists (lmdeploy's ``/generate``: pairs).

    Parameters
    ----------
    payload : object
        The parsed JSON document.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, sample key, arrivals, ...).
    where : str, default "$"
        Where the payload is in the source, for error messages.
    """
    payload = _obj(payload, rows, where)
    info = _obj(payload.get("meta_info"), rows, where, "meta_info")
    mwhere = f"{where}.meta_info"
    request_id = info.get("id")
    counts = {}
    for segment, prefix in (("prompt", "input"), ("completion", "output")):
        tokens = info.get(f"{prefix}_token_logprobs")
        if tokens is None:
            counts[segment] = 0
            continue
        tokens = _list(tokens, rows, mwhere, f"{prefix}_token_logprobs")
        tops = info.get(f"{prefix}_top_logprobs")
        if tops is not None and len(_list(tops, rows, mwhere, f"{prefix}_top_logprobs")) != len(tokens):
            raise DumpError(
                rows.source, mwhere, f"{prefix}_top_logprobs", f"holds {len(tops)} positions for {len(tokens)} tokens"
            )
        first = _first_scored_position(info, len(tokens), rows, mwhere) if segment == "prompt" else 0
        for p, triple in enumerate(tokens):
            add_sglang_token(
                rows,
                meta,
                (meta.record, 0, segment, first + p),
                f"{mwhere}.{prefix}_token_logprobs[{p}]",
                triple,
                None if tops is None else tops[p],
                f"{mwhere}.{prefix}_top_logprobs[{p}]",
                request_id,
            )
        counts[segment] = len(tokens)
    finish = info.get("finish_reason")
    completion_tokens = info.get("completion_tokens")
    if (
        completion_tokens is not None
        and info.get("output_token_logprobs") is not None
        and completion_tokens != counts["completion"]
    ):
        raise DumpError(
            rows.source,
            mwhere,
            "completion_tokens",
            f"says {completion_tokens} but output_token_logprobs hold {counts['completion']}",
        )
    known = {
        "id",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "input_token_logprobs",
        "output_token_logprobs",
        "input_top_logprobs",
        "output_top_logprobs",
    }
    extra = {k: v for k, v in info.items() if k not in known}
    rows.request(
        **meta.request_columns(),
        choice_index=0,
        request_id=request_id,
        endpoint="generate",
        stream=False,
        finish_reason=finish.get("type") if isinstance(finish, dict) else finish,
        prompt_tokens=info.get("prompt_tokens"),
        completion_tokens=completion_tokens,
        n_prompt_scored=counts["prompt"],
        n_completion_scored=counts["completion"],
        completion_text=payload.get("text"),
        extra={**meta.extra, **({"meta_info": extra} if extra else {})},
    )


def add_sglang_token(
    rows: Rows,
    meta: Meta,
    key: tuple,
    where: str,
    triple: Any,
    top: Any,
    top_where: str,
    request_id: Any,
    *,
    stream_chunk: int | None = None,
    t_arrival: float | None = None,
) -> None:
    """One ``[logprob, token_id, text]`` triple (or lmdeploy's pair) and its top list (null or a list of them).

    Parameters
    ----------
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context.
    key : tuple of (int, int, str, int)
        (record, choice_index, segment, position).
    where : str
        Where the triple is in the source, for error messages.
    triple : object
        ``[logprob, token_id, text]`` (or ``[logprob, token_id]``).
    top : object
        The position's top list (triples), or None.
    top_where : str
        Where the top list is in the source.
    request_id : object
        The request's id (``meta_info.id``).
    stream_chunk : int, optional
        The stream event that carried the token.
    t_arrival : float, optional
        When that event arrived, in seconds since the request was sent.
    """
    logprob, token_id, text = _triple(triple, rows, where)
    top = None if top is None else _list(top, rows, top_where, None)
    rows.token(
        key,
        where,
        raw=logprob,
        request_id=request_id,
        sample_key=meta.sample_key,
        token_id=token_id,
        token_text=text,
        n_candidates=None if top is None else len(top),
        stream_chunk=stream_chunk,
        t_arrival=t_arrival,
    )
    if top is not None:
        entries = []
        for k, cand in enumerate(top):
            lp, cid, ctext = _triple(cand, rows, f"{top_where}[{k}]")
            entries.append({"token_id": cid, "token_text": ctext, "raw": lp})
        rows.candidates_for(key, top_where, entries, list_kind="top_logprobs", sampled_id=token_id, sampled_text=None)


def _first_scored_position(info: dict, scored: int, rows: Rows, where: str) -> int:
    """The prompt position of ``input_token_logprobs[0]``: with ``logprob_start_len`` = k the list
    covers the prompt's last ``prompt_tokens - k`` tokens, so it starts at ``prompt_tokens - len``.

    Examples
    --------
    >>> _first_scored_position({"prompt_tokens": 6}, 2, None, "$")  # logprob_start_len=4: positions 4 and 5
    4
    >>> _first_scored_position({}, 3, None, "$")  # no prompt length: from the start
    0
    """
    total = info.get("prompt_tokens")
    if not isinstance(total, int) or isinstance(total, bool):
        return 0
    if scored > total:
        raise DumpError(
            rows.source, where, "input_token_logprobs", f"holds {scored} positions for prompt_tokens {total}"
        )
    return total - scored


# --- llama.cpp native -----------------------------------------------------------------------------


def add_llamacpp_probabilities(
    probs: Any,
    rows: Rows,
    meta: Meta,
    where: str,
    *,
    start: int = 0,
    stream_chunk: int | None = None,
    t_arrival: float | None = None,
) -> int:
    """``completion_probabilities``: the legacy ``{content, probs: [{tok_str, prob}]}`` or the
    current ``{id, token, logprob|prob, bytes, top_logprobs|top_probs}`` entries. Returns the next position.

    Parameters
    ----------
    probs : object
        The ``completion_probabilities`` list as parsed.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context.
    where : str
        Where the list is in the source, for error messages.
    start : int, default 0
        The completion position of its first entry (a stream's chunks continue where the last one stopped).
    stream_chunk : int, optional
        The stream event that carried the entries.
    t_arrival : float, optional
        When that event arrived, in seconds since the request was sent.

    Returns
    -------
    int
    """
    position = start
    for k, step in enumerate(_list(probs, rows, where, "completion_probabilities")):
        swhere = f"{where}[{k}]"
        step = _obj(step, rows, swhere)
        key = (meta.record, 0, "completion", position)
        if "probs" in step and "content" in step:
            _legacy_llamacpp_step(step, rows, meta, key, swhere, stream_chunk, t_arrival)
        else:
            add_entry(
                rows, step, key, swhere, request_id=None, meta=meta, stream_chunk=stream_chunk, t_arrival=t_arrival
            )
        position += 1
    return position


def _legacy_llamacpp_step(step: dict, rows: Rows, meta: Meta, key, where: str, stream_chunk, t_arrival) -> None:
    """Old builds: candidates keyed by ``tok_str`` with probabilities; the sampled text is ``content``."""
    content = step.get("content")
    entries = []
    for k, cand in enumerate(_list(step.get("probs"), rows, where, "probs")):
        cand = _obj(cand, rows, f"{where}.probs[{k}]")
        entries.append(
            {
                "token_text": cand.get("tok_str"),
                "raw": cand.get("prob"),
                "token_id": _int_or_none(cand.get("id"), rows, where, "id", token_id=True),
            }
        )
    own = next((e for e in entries if e["token_text"] == content), None)
    rows.token(
        key,
        where,
        raw=None if own is None else own["raw"],
        kind="prob",
        missing=own is None,
        sample_key=meta.sample_key,
        token_text=content,
        n_candidates=len(entries),
        stream_chunk=stream_chunk,
        t_arrival=t_arrival,
        logprob_semantics="unknown",
    )
    rows.candidates_for(
        key, where, entries, list_kind="top_logprobs", sampled_id=None, sampled_text=content, kind="prob"
    )


def parse_llamacpp(payload: Any, rows: Rows, meta: Meta, where: str = "$") -> None:
    """llama.cpp ``/completion`` (non-streamed).

    Parameters
    ----------
    payload : object
        The parsed JSON document.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, sample key, arrivals, ...).
    where : str, default "$"
        Where the payload is in the source, for error messages.
    """
    payload = _obj(payload, rows, where)
    probs = payload.get("completion_probabilities")
    n = 0 if probs is None else add_llamacpp_probabilities(probs, rows, meta, f"{where}.completion_probabilities")
    predicted = payload.get("tokens_predicted")
    if probs and predicted is not None and predicted != n:
        raise DumpError(
            rows.source, where, "tokens_predicted", f"says {predicted} but completion_probabilities hold {n}"
        )
    rows.request(
        **meta.request_columns(),
        choice_index=0,
        model=payload.get("model"),
        endpoint="completion",
        stream=False,
        finish_reason=payload.get("stop_type"),
        prompt_tokens=payload.get("tokens_evaluated"),
        completion_tokens=predicted,
        n_prompt_scored=0,
        n_completion_scored=n,
        completion_text=payload.get("content"),
        extra={**meta.extra, **({"timings": payload["timings"]} if "timings" in payload else {})},
    )


# --- TGI -----------------------------------------------------------------------------------------------


def parse_tgi(payload: Any, rows: Rows, meta: Meta, where: str = "$") -> None:
    """Text Generation Inference: ``details.prefill``, ``details.tokens`` and ``details.top_tokens``.

    Parameters
    ----------
    payload : object
        The parsed JSON document.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, sample key, arrivals, ...).
    where : str, default "$"
        Where the payload is in the source, for error messages.
    """
    if isinstance(payload, list) and len(payload) == 1:
        payload, where = payload[0], f"{where}[0]"
    payload = _obj(payload, rows, where)
    details = _obj(payload.get("details"), rows, where, "details")
    dwhere = f"{where}.details"
    counts = {}
    for segment, name in (("prompt", "prefill"), ("completion", "tokens")):
        tokens = _list(details.get(name) or [], rows, dwhere, name)
        tops = details.get("top_tokens") if segment == "completion" else None
        if tops and len(tops) != len(tokens):
            raise DumpError(rows.source, dwhere, "top_tokens", f"holds {len(tops)} positions for {len(tokens)} tokens")
        for p, token in enumerate(tokens):
            twhere = f"{dwhere}.{name}[{p}]"
            token = _obj(token, rows, twhere)
            key = (meta.record, 0, segment, p)
            token_id = _int_or_none(token.get("id"), rows, twhere, "id", token_id=True)
            top = _list(tops[p], rows, dwhere, f"top_tokens[{p}]") if tops else None
            rows.token(
                key,
                twhere,
                raw=token.get("logprob"),
                sample_key=meta.sample_key,
                token_id=token_id,
                token_text=token.get("text"),
                n_candidates=None if top is None else len(top),
            )
            if top is not None:
                entries = []
                for k, cand in enumerate(top):
                    cand = _obj(cand, rows, f"{dwhere}.top_tokens[{p}][{k}]")
                    entries.append(
                        {"token_id": cand.get("id"), "token_text": cand.get("text"), "raw": cand.get("logprob")}
                    )
                rows.candidates_for(
                    key,
                    f"{dwhere}.top_tokens[{p}]",
                    entries,
                    list_kind="top_logprobs",
                    sampled_id=token_id,
                    sampled_text=None,
                )
        counts[segment] = len(tokens)
    generated = details.get("generated_tokens")
    if generated is not None and generated != counts["completion"]:
        raise DumpError(
            rows.source, dwhere, "generated_tokens", f"says {generated} but tokens hold {counts['completion']}"
        )
    text, full = _tgi_completion_text(payload.get("generated_text"), details.get("tokens") or [])
    extra = {
        **meta.extra,
        **({"seed": details["seed"]} if "seed" in details else {}),
        **({"full_text": full} if full is not None else {}),
    }
    rows.request(
        **meta.request_columns(),
        choice_index=0,
        endpoint="generate",
        stream=False,
        finish_reason=details.get("finish_reason"),
        completion_tokens=generated,
        n_prompt_scored=counts["prompt"],
        n_completion_scored=counts["completion"],
        completion_text=text,
        extra=extra,
    )


def _tgi_completion_text(generated_text: Any, tokens: list) -> tuple[Any, str | None]:
    """The completion's text, and the whole text when TGI returned the prompt too (``return_full_text``).

    That text ends with the completion tokens' texts (special tokens aside) and is longer: the
    completion is that tail; any other text is kept as it came.

    Examples
    --------
    >>> _tgi_completion_text("The capital is Paris.", [{"text": " Paris"}, {"text": "."}, {"text": "</s>", "special": True}])
    (' Paris.', 'The capital is Paris.')
    >>> _tgi_completion_text(" Paris.", [{"text": " Paris"}, {"text": "."}])
    (' Paris.', None)
    """
    if not isinstance(generated_text, str) or not all(
        isinstance(t, dict) and isinstance(t.get("text"), str) for t in tokens
    ):
        return generated_text, None
    tail = "".join(t["text"] for t in tokens if not t.get("special"))
    if tail and len(generated_text) > len(tail) and generated_text.endswith(tail):
        return tail, generated_text
    return generated_text, None


# --- prime-rl token export ----------------------------------------------------------------------


def parse_primerl(payload: Any, rows: Rows, meta: Meta, where: str = "$") -> None:
    """One prime-rl export line: parallel ``token_ids``, ``inference_logprobs``, ``trainer_logprobs``, ``loss_mask``.

    The inference engine's logprob is the token's value; the trainer's recomputation of the
    same token is a candidate row with ``list_kind = "trainer_recompute"``, so both stay joinable.

    Parameters
    ----------
    payload : object
        The parsed JSON document.
    rows : Rows
        The rows to append to.
    meta : Meta
        The capture's batch context and timing (record number, sample key, arrivals, ...).
    where : str, default "$"
        Where the payload is in the source, for error messages.
    """
    payload = _obj(payload, rows, where)
    if payload.get("schema_version") != 1:
        raise DumpError(rows.source, where, "schema_version", f"expected 1, got {payload.get('schema_version')!r}")
    token_ids = _list(payload.get("token_ids"), rows, where, "token_ids")
    columns = {}
    for name in ("inference_logprobs", "trainer_logprobs", "loss_mask"):
        value = payload.get(name)
        if value is not None and len(_list(value, rows, where, name)) != len(token_ids):
            raise DumpError(rows.source, where, name, f"holds {len(value)} values for {len(token_ids)} token_ids")
        columns[name] = value
    inference, trainer, mask = columns["inference_logprobs"], columns["trainer_logprobs"], columns["loss_mask"]
    sample_key = meta.sample_key or (str(payload["sample_id"]) if "sample_id" in payload else None)
    for p, token_id in enumerate(token_ids):
        twhere = f"{where}.token_ids[{p}]"
        _int_or_none(token_id, rows, where, f"token_ids[{p}]", token_id=True)
        key = (meta.record, 0, "completion", p)
        rows.token(
            key,
            twhere,
            raw=None if inference is None else inference[p],
            missing=inference is None,
            sample_key=sample_key,
            token_id=token_id,
            loss_mask=None if mask is None else bool(mask[p]),
            logprob_semantics="raw",
        )
        if trainer is not None:
            rows.candidates_for(
                key,
                f"{where}.trainer_logprobs[{p}]",
                [{"token_id": token_id, "raw": trainer[p]}],
                list_kind="trainer_recompute",
                sampled_id=token_id,
                sampled_text=None,
            )
    known = {"schema_version", "token_ids", "inference_logprobs", "trainer_logprobs", "loss_mask"}
    rows.request(
        **meta.request_columns() | {"sample_key": sample_key},
        choice_index=0,
        endpoint="prime-rl export",
        stream=False,
        n_prompt_scored=0,
        n_completion_scored=len(token_ids),
        extra={**meta.extra, **{k: v for k, v in payload.items() if k not in known}},
    )
