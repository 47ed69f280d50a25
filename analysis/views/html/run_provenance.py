"""A run's detail above its tables: its provenance, settings, what it lacks, the negative control of each prompt and
the forks inside its bands, each value formatted for people and escaped by the template."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

from ...core import canonical_setting, cell, pairs
from ...run import piecewise
from .blocks import render
from .tables import WORST_ROWS

FEW = 5  # per-prompt sentences (negative controls, forks) listed before the rest are counted


@piecewise("token_labels", merge=lambda rows: rows.unique("token_id", keep="first", maintain_order=True))
def _labelled_tokens(run) -> pl.DataFrame:
    """Each token id's first row with a text or bytes (``token_id``, ``token_text``, ``token_bytes``)."""
    return (
        run.dump.tokens.select("token_id", "token_text", "token_bytes")
        .filter(
            pl.col("token_id").is_not_null()
            & (pl.col("token_text").is_not_null() | pl.col("token_bytes").is_not_null())
        )
        .unique("token_id", keep="first", maintain_order=True)
    )


def _token_labels(run) -> dict[Any, str]:
    """A readable label for each token identity: its text when the dump had one, else ``id N``."""
    labelled = _labelled_tokens(run)
    return {
        token_id: text if text is not None else data.decode("utf-8", errors="replace")
        for token_id, text, data in labelled.rows()
    }


def _label(identity: Any, labels: Mapping[Any, str]) -> str:
    if isinstance(identity, tuple):
        text, data = identity
        return text if text is not None else (data or b"").decode("utf-8", errors="replace")
    return labels.get(identity, f"id {identity}")


def negative_control(run, prompt_id: str) -> dict[str, Any]:
    """Plant a divergence in a copy of ref #1 (a token it never produced, at its middle step) and check that it is found.

    Parameters
    ----------
    run : Run
        The run.
    prompt_id : str
        The prompt whose ref #1 is copied.

    Returns
    -------
    dict
    """
    from ...metrics import parity

    refs = run.dump.requests.filter((pl.col("role") == "reference") & (pl.col("prompt_id") == prompt_id)).sort("slot")
    row = refs.row(0, named=True)
    one = (
        pl.col("source").eq_missing(row["source"])
        & pl.col("record").eq_missing(row["record"])
        & pl.col("choice_index").eq_missing(row["choice_index"])
    )
    return _planted(
        next(iter(parity.streams(run.dump.tokens.filter(one)).values()), parity.Stream(("none",), ())), prompt_id
    )


def _planted(reference, prompt_id: str) -> dict[str, Any]:
    """:func:`negative_control` of a prompt's ref #1 stream."""
    from ...metrics import parity

    at = len(reference) // 2
    planted = list(reference.identities)
    if planted:
        planted[at] = ("<planted>", b"\x00planted")
    found = parity.compare(reference, parity.Stream(("control",), tuple(planted)))
    return {
        "prompt_id": prompt_id,
        "planted_at": at,
        "found_at": found.divergence_at,
        "detected": bool(planted) and found.divergence_at == at,
    }


def _controls(run, prompts: list[str]) -> dict[str, Any]:
    """The negative control of every prompt with a reference: the missed ones first, then a few found, and the count."""
    rows = {row["prompt_id"]: row for row in _control_rows(run).iter_rows(named=True)}
    controls = [rows[p] for p in prompts if p in rows]
    missed = [c for c in controls if not c["detected"]]
    shown = (missed + [c for c in controls if c["detected"]])[: max(FEW, len(missed))]
    return {"shown": shown, "total": len(controls), "detected": len(controls) - len(missed)}


@piecewise("controls")
def _control_rows(run) -> pl.DataFrame:
    """:func:`negative_control` of each prompt's first reference (lowest slot), their streams built in one pass."""
    from ...metrics import parity

    key = ["source", "record", "choice_index"]
    firsts = (
        run.dump.requests.filter(pl.col("role") == "reference")
        .sort("prompt_id", "slot", maintain_order=True)
        .unique("prompt_id", keep="first", maintain_order=True)
        .select("prompt_id", *key)
    )
    tokens = run.dump.tokens.join(firsts.select(key), on=key, how="semi", nulls_equal=True)
    streams = parity.streams(tokens)
    rows = [
        _planted(streams.get((source, record, choice), parity.Stream(("none",), ())), prompt)
        for prompt, source, record, choice in firsts.iter_rows()
    ]
    schema = {"prompt_id": pl.String, "planted_at": pl.Int64, "found_at": pl.Int64, "detected": pl.Boolean}
    return pl.DataFrame(rows, schema=schema)


def _forks(run) -> dict[str, Any]:
    """Where the slots of each band part among themselves: the earliest forks, and how many bands never part."""
    from ...run import band_forks

    labels, parted = _token_labels(run), []
    forks = band_forks(run)
    for (prompt, c, repeat, at), group in forks.filter(pl.col("slots").is_not_null()).group_by(
        ["prompt_id", "c", "repeat", "position"], maintain_order=True
    ):
        branches = [
            (_label(token_id if token_id is not None else (text, data), labels), n)
            for token_id, text, data, n in group.select("token_id", "token_text", "token_bytes", "slots").rows()
        ]
        parted.append({"prompt_id": prompt, "c": c, "repeat": repeat, "at": at, "branches": branches})
    parted.sort(key=lambda f: (f["at"], f["c"]))
    bands = forks.select("prompt_id", "c", "repeat").unique().height
    return {"shown": parted[:WORST_ROWS], "parted": len(parted), "bands": bands}


def _settings(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    requested, effective = manifest.get("requested", {}) or {}, manifest.get("effective", {}) or {}
    # a setting differs only when both sides name it: the probe's own choices (layout, ...) have no server-side twin;
    # a requested alias the server took under its canonical name (batch-invariant: one-by-one) was honoured, not refused
    rows = []
    for k in sorted(set(requested) | set(effective)):
        both = k in requested and k in effective and requested[k] != effective[k]
        alias = both and canonical_setting(k, requested[k]) == effective[k]
        rows.append(
            {
                "name": k,
                "requested": cell(requested.get(k)),
                "effective": cell(effective.get(k)),
                "differs": both and not alias,
                "alias": alias,
            }
        )
    return rows


def _identity(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What served the run and how it was asked, as (label, text) rows."""
    identity = manifest.get("identity", {}) or {}
    rows = [
        ("engine", identity.get("engine")),
        ("engine chosen", (manifest.get("engine") or {}).get("said")),
        ("host", identity.get("host")),
        ("server commit", identity.get("commit")),
        ("model", (identity.get("model") or {}).get("path")),
        ("model sha256", ((identity.get("model") or {}).get("sha256") or "")[:16] or None),
    ]
    return [(label, cell(value)) for label, value in rows if value is not None or label in ("engine", "host", "model")]


def run_html(run) -> str:
    """A run's provenance, settings, what it lacks, its negative control and the forks inside its bands.

    Parameters
    ----------
    run : Run
        The run.

    Returns
    -------
    str
        HTML.
    """
    manifest = run.manifest
    prompts = run.prompts
    return render(
        "run.html.j2",
        run=run,
        identity=_identity(manifest),
        ladder=cell(run.ladder),
        declared_min=cell(run.declared_min),
        sampler=pairs(manifest.get("sampler")),
        environment=pairs(manifest.get("environment")),
        settings=_settings(manifest),
        controls=_controls(run, prompts),
        forks=_forks(run),
        missing=run.missing(),
        refused=_refused(manifest),
        complete=manifest.get("complete", True),
        skipped=run.dump.skipped,
    )


def _refused(manifest: Mapping[str, Any]) -> list[dict[str, str]]:
    return [
        {
            "what": " ".join(
                p
                for p in (
                    cell(r.get("prompt_id")),
                    cell(r.get("role")),
                    f"c={r['c']}" if r.get("c") else "",
                    f"slot {cell(r.get('slot'))}",
                )
                if p
            ),
            "reason": cell(r.get("reason")),
        }
        for r in manifest.get("refused") or []
    ]
