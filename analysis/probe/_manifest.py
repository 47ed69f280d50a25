"""A probe run's manifest: the settings it was made with, what the engine decided, and the checks of what the server reports."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from typing import Any

import httpx

from ..run import ARM_REPEATS, PREFIX_SHARES, RUN_VERSION
from ._engines import Detection
from ._rundir import _now
from ._settings import ProbeSettings


def _apply_detection(manifest: dict[str, Any], detection: Detection) -> None:
    """What the engine decides in a run's manifest: its name, the model, ignore_eos, what the server says of itself."""
    manifest["identity"] = {
        "host": platform.node(),
        "engine": detection.profile.label,
        "model": {"path": detection.model},
    }
    manifest["engine"] = {
        "profile": detection.profile.name,
        "evidence": list(detection.evidence),
        "said": detection.describe(),
        "running_metric": detection.profile.running_metric if detection.metrics else None,
    }
    manifest["sampler"]["ignore_eos"] = "ignore_eos" in detection.profile.body
    manifest["server"] = {"info_path": detection.info_path, "info": detection.info}
    manifest["effective"] = detection.profile.effective(detection.info)


def _new_manifest(endpoint: str, detection: Detection, settings: ProbeSettings) -> dict[str, Any]:
    """A new run's manifest: the settings it is made with, and what the engine decides."""
    s = settings
    manifest = {
        "run_version": RUN_VERSION,
        "producer": "bia probe",
        "url": endpoint,
        "started": _now(),
        "sampler": {"temperature": 0.0, "seed": s.seed, "max_tokens": s.max_tokens, "top_logprobs": s.top_logprobs},
        "ladder": list(s.ladder),
        "repeats": s.repeats,
        "observer": s.observer,
        "bands_anyway": s.bands_anyway,
        "declared_min": s.declared_min if s.declared_min is not None else min(64, s.max_tokens),
        "max_constant_run": 16,
        "prompts": [_prompt_entry(i, p) for i, p in enumerate(s.prompts)],
        "fillers": list(s.fillers),
        "requested": {
            "layout": s.layout,
            "stream": True,
            "engine": s.engine,
            "log_pattern": s.log_pattern,
            "server_log": str(s.server_log) if s.server_log else None,
            "refire": s.refire,
            "refire_s": s.refire_s,
            **s.expect,
        },
        "expected": sorted(s.expect),
        "environment": {"python": platform.python_version(), "httpx": httpx.__version__, "machine": platform.machine()},
        "done": [],
        "m_formed": [],
        "refused": [],
        "complete": False,
    }
    if s.arms is not None:  # a run with control arms (analysis.run._arms): its plan is the arms'
        manifest.update(arms=list(s.arms), arm_repeats=ARM_REPEATS, prefix_shares=list(PREFIX_SHARES))
    _apply_detection(manifest, detection)
    return manifest


def expectation_notes(manifest: dict[str, Any]) -> list[str]:
    """A line for each expected setting the server contradicts or does not report.

    Parameters
    ----------
    manifest : dict of str to object
        The run's manifest: its ``expected`` keys, their ``requested`` values and the server's ``effective`` settings.

    Returns
    -------
    list of str

    Examples
    --------
    >>> expectation_notes({"expected": ["kernel_mode"], "requested": {"kernel_mode": "batch-invariant"}, "effective": {"kernel_mode": "default"}})
    ["warning: the server reports kernel_mode='default', not the expected 'batch-invariant'"]
    """
    effective, requested = manifest.get("effective") or {}, manifest.get("requested") or {}
    notes = []
    for key in manifest.get("expected", []):
        if key not in effective:
            notes.append(
                f"note: the server does not report {key}; the expected {requested.get(key)!r} cannot be checked"
            )
        elif effective[key] != requested.get(key):
            notes.append(
                f"warning: the server reports {key}={effective[key]!r}, not the expected {requested.get(key)!r}"
            )
    return notes


def _prompt_entry(index: int, prompt: str | Mapping[str, Any]) -> dict[str, Any]:
    """A prompt as the manifest keeps it: its id, its text, and its answer when one is given (for accuracy)."""
    if isinstance(prompt, str):
        return {"prompt_id": f"p{index}", "text": prompt}
    entry = {"prompt_id": f"p{index}", "text": prompt["text"]}
    if prompt.get("answer") is not None:
        entry["answer"] = str(prompt["answer"])
    return entry
