"""The run directory's contract: its plan of requests, its manifest on disk, and what the manifest says of each band."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ..core import check_depth, not_json
from ._arms import arm_plan
from ._batch import ROTATING
from ._manifest import manifest_problem
from ._unit import _DEFAULTS, Unit

RUN_VERSION = (
    2  # 2: a band's concurrency is "c" in the manifest and the capture envelopes (1 named it "band_c": legacy)
)
READABLE_VERSIONS = (1, 2)


@runtime_checkable
class RunLike(Protocol):
    """What the tables, the witness export and the derived cache need of a run: :class:`analysis.Run` is one.

    They take this shape rather than the class, so the class (and its card, which shows tables) sits
    above them and nothing in ``analysis.run`` imports in a circle.
    """

    manifest: dict[str, Any]
    dump: Any
    path: Path | None
    _cache: dict


class RunError(ValueError):
    """A run directory or mapping that cannot be read; the message names the file and field."""


def plan(manifest: Mapping[str, Any]) -> list[Unit]:
    """What a run's manifest calls for, in the order a probe sends it: per prompt the two m=1
    references, then each repeat of the ladder (each band followed by its observer twin, without
    logprobs, when ``observer`` is set).

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest: ``prompts``, ``ladder``, ``repeats`` (1 by default), ``observer``,
        ``requested.layout`` (``needle`` records one slot per band, ``rotating`` c - 1) and ``arms`` (then
        ``arm_plan``'s plan).

    Returns
    -------
    list of Unit

    Examples
    --------
    >>> [u.key for u in plan({"ladder": [1, 4], "prompts": [{"prompt_id": "p0"}], "observer": True})]
    ['p0/reference/s0', 'p0/reference/s1', 'p0/band/c1/r0', 'p0/observer/c1/r0', 'p0/band/c4/r0', 'p0/observer/c4/r0']
    """
    if manifest.get("arms") is not None:
        return arm_plan(manifest)
    ladder = list(manifest.get("ladder", _DEFAULTS["ladder"]))
    layout = (manifest.get("requested") or {}).get("layout")
    roles = ("band", "observer") if manifest.get("observer") else ("band",)
    units = []
    for prompt in manifest.get("prompts", []):
        pid = str(prompt.get("prompt_id"))
        units += [Unit(pid, "reference", None, 0, (slot,)) for slot in (0, 1)]
        for repeat in range(int(manifest.get("repeats", 1))):
            units += [Unit(pid, role, c, repeat, _band_slots(layout, c)) for c in ladder for role in roles]
    return units


def _band_slots(layout: str | None, c: int) -> tuple[int, ...]:
    """The slots a band records: the needle alone, every copy (``rotating``: all rows but its companion's), or all c.

    Examples
    --------
    >>> _band_slots("needle", 4), _band_slots("rotating", 4), _band_slots("rotating", 1), _band_slots("copies", 2)
    ((0,), (0, 1, 2), (0,), (0, 1))
    """
    if layout == "needle":
        return (0,)
    return tuple(range(c - 1 if layout == ROTATING and c > 1 else c))


def _parse_json(text: str) -> Any:
    """``json.loads`` behind the nesting guard, so a hostile manifest is a ValueError, not a RecursionError."""
    check_depth(text)
    return json.loads(text)


def load_manifest(path: Path) -> dict[str, Any]:
    """Read and check a run directory's ``manifest.json``.

    Parameters
    ----------
    path : Path
        The run directory.

    Returns
    -------
    dict
        The manifest, its fields' types checked.

    Raises
    ------
    RunError
        No such folder, no manifest, or one that is not UTF-8 JSON or has a field of the wrong type.
    """
    manifest_path = path / "manifest.json"
    if (
        not path.exists()
    ):  # a relative path from another folder (a notebook in notebooks/, say): say where it was looked for
        where = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
        raise RunError(
            f"{path}: no such folder{where}; the bundled runs are analysis.default_runs(), whatever the working folder"
        )
    if not manifest_path.exists():
        raise RunError(f"{path}: no manifest.json; a run directory starts with its manifest")
    try:
        manifest = _parse_json(manifest_path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise RunError(f"{manifest_path}: not UTF-8 text ({exc})") from None
    except ValueError as exc:
        raise RunError(f"{manifest_path}: {not_json(exc)}") from None
    return _checked_manifest(manifest, manifest_path)


def _checked_manifest(manifest: Any, where: Any) -> dict[str, Any]:
    """The manifest when it is an object of this run version whose fields have their types; else a RunError naming the field."""
    if not isinstance(manifest, dict):
        raise RunError(f"{where}: expected a JSON object")
    version = manifest.get("run_version", 1)
    if version not in READABLE_VERSIONS:
        raise RunError(f"{where}: run_version {version!r} is not one of {', '.join(map(str, READABLE_VERSIONS))}")
    if version == 1:
        manifest = _legacy_manifest(manifest)
    problem = manifest_problem(manifest)
    if problem:
        raise RunError(f"{where}: {problem}")
    return manifest


def _legacy_manifest(manifest: dict[str, Any]) -> dict[str, Any]:
    """A run_version 1 manifest in this version's words: its entries' legacy key ``band_c`` read as ``c``.

    Examples
    --------
    >>> _legacy_manifest({"run_version": 1, "m_formed": [{"band_c": 4, "widths": [4]}]})["m_formed"]  # legacy band_c
    [{'c': 4, 'widths': [4]}]
    """

    def upgraded(entry: Any) -> Any:
        if not isinstance(entry, dict) or "band_c" not in entry or "c" in entry:  # no legacy key to read
            return entry
        return {("c" if key == "band_c" else key): value for key, value in entry.items()}  # legacy key of run_version 1

    lists = {
        name: [upgraded(e) for e in manifest[name]]
        for name in ("m_formed", "refused", "skipped")
        if isinstance(manifest.get(name), list)
    }
    return {**manifest, **lists}


def band_widths(
    manifest: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None, role: str = "band", arm: str | None = None
) -> tuple[list[int], str | None]:
    """Every batch width a run recorded for one band, and the evidence they come from.

    The server log's per-step widths when there are any (``"log"``); else whichever of the
    running-requests gauge sampled during the band (``"metrics"``) and the engine's own counters
    (``"engine"``: at least ceil(tokens generated / engine steps) requests decoded in one step) shows
    the wider batch, the gauge at a tie; else the band's own streams (``"streams"``): how many of its
    requests were decoding at the same time, their live windows (first to last content chunk)
    overlapping, which the probe records as ``streams.co_resident``. The gauge and the counters are
    each a lower bound of the widest batch formed; a front end that lags its engine (vLLM's on a busy
    CPU) samples the gauge late, while the counters are the engine's. A gauge sample of 0 caught the
    server idle (before the band's requests arrived, or after they finished): it is no batch width,
    so a band with nothing else has no width observed, which is unknown (``([], None)``), not 0.
    ``width_evidence()`` gives every kind of evidence a band has, not only the one chosen. ``arm`` picks the band of that
    control arm in a run probed with arms (an entry without ``arm``, from a run made before arms, matches any).

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest (``manifest.json``).
    prompt_id : str
        The band's prompt.
    c : int
        The band's width asked for (its number of requests released together).
    repeat : int or None
        Which repeat of the ladder; None matches an entry of any repeat.
    role : str, default "band"
        ``band``, or ``observer`` for its twin fired without logprobs.
    arm : str, optional
        The control arm of a run probed with arms; None, or an entry without one, matches any.

    Returns
    -------
    widths : list of int
        The widths; empty when none was observed.
    evidence : str or None
        ``log``, ``metrics``, ``engine`` or ``streams``; None with no widths.

    Examples
    --------
    >>> manifest = {"m_formed": [{"prompt_id": "p0", "c": 4, "repeat": 0, "widths": [], "running": [0, 4, 4, 2, 0]}]}
    >>> band_widths(manifest, "p0", 4, 0)
    ([4, 4, 2], 'metrics')
    >>> band_widths({"m_formed": [{"prompt_id": "p0", "c": 4, "repeat": 0, "running": [0], "streams": {"co_resident": 4}}]}, "p0", 4, 0)
    ([4], 'streams')
    >>> engine = {"generated": {"metric": "g", "before": 0, "after": 128}, "steps": {"metric": "s", "before": 0, "after": 33}}
    >>> band_widths({"m_formed": [{"prompt_id": "p0", "c": 4, "repeat": 0, "running": [0, 1], "engine": engine}]}, "p0", 4, 0)
    ([4], 'engine')
    >>> band_widths({"m_formed": [{"prompt_id": "p0", "c": 1, "repeat": 0, "widths": [], "running": [0]}]}, "p0", 1, 0)
    ([], None)
    """
    return _chosen_widths(width_evidence(manifest, prompt_id, c, repeat, role, arm))


def _chosen_widths(evidence: Mapping[str, list[int]]) -> tuple[list[int], str | None]:
    """:func:`band_widths` of a band's :func:`width_evidence`."""
    if evidence.get("log"):
        return evidence["log"], "log"
    engine_sides = [kind for kind in ("metrics", "engine") if evidence.get(kind)]
    if engine_sides:
        origin = max(engine_sides, key=lambda kind: (max(evidence[kind]), kind == "metrics"))
        return evidence[origin], origin
    if evidence.get("streams"):
        return evidence["streams"], "streams"
    return [], None


def width_evidence(
    manifest: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None, role: str = "band", arm: str | None = None
) -> dict[str, list[int]]:
    """Each kind of evidence of a band's batch width, with the widths it shows: ``log`` (the server log's per-step
    widths, or the ``max`` a witness recorded), ``metrics`` (the gauge's busy samples), ``engine`` (one width: see
    :func:`engine_steps`), ``streams`` (the co-residency of the band's streams, one width). Kinds the run has
    nothing of are left out.

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest (``manifest.json``).
    prompt_id : str
        The band's prompt.
    c : int
        The band's width asked for (its number of requests released together).
    repeat : int or None
        Which repeat of the ladder; None matches an entry of any repeat.
    role : str, default "band"
        ``band``, or ``observer`` for its twin fired without logprobs.
    arm : str, optional
        The control arm of a run probed with arms; None, or an entry without one, matches any.

    Returns
    -------
    dict of str to list of int

    Examples
    --------
    >>> entry = {"prompt_id": "p0", "c": 8, "repeat": 0, "running": [0, 8, 7], "streams": {"co_resident": 8}}
    >>> width_evidence({"m_formed": [entry]}, "p0", 8, 0)
    {'metrics': [8, 7], 'streams': [8]}
    """
    return _entry_evidence(_band_entry(manifest, prompt_id, c, repeat, role, arm))


def _entry_evidence(entry: Mapping[str, Any] | None) -> dict[str, list[int]]:
    """:func:`width_evidence` of a band's ``m_formed`` entry (None: the band has none)."""
    entry = entry or {}
    out: dict[str, list[int]] = {}
    if entry.get("widths"):
        out["log"] = [int(w) for w in entry["widths"]]
    elif entry.get("max"):
        out["log"] = [int(entry["max"])]
    busy = [int(w) for w in entry.get("running") or [] if w]
    if busy:
        out["metrics"] = busy
    steps = engine_steps(entry)
    if steps is not None:
        generated, count = steps
        out["engine"] = [-(-generated // count)]  # ceil: some step decoded at least the mean
    streams = (entry.get("streams") or {}).get("co_resident")
    if streams:
        out["streams"] = [int(streams)]
    return out


def engine_steps(entry: Mapping[str, Any]) -> tuple[int, int] | None:
    """The tokens a band generated and the engine steps that generated them, from the engine's counters diffed
    around the band (the probe's ``engine`` record: vLLM's ``vllm:generation_tokens_total`` and
    ``vllm:iteration_tokens_total_count``). Each step with output gives each request in its batch one token, so
    generated / steps is the mean batch width, and some step held at least its ceiling. None without both
    counters or without a step.

    Parameters
    ----------
    entry : Mapping of str to Any
        The band's ``m_formed`` entry in the manifest.

    Returns
    -------
    tuple of (int, int) or None
        The tokens generated and the engine steps.

    Examples
    --------
    >>> engine_steps({"engine": {"generated": {"metric": "g", "before": 64, "after": 192}, "steps": {"metric": "s", "before": 64, "after": 97}}})
    (128, 33)
    >>> engine_steps({"engine": {"generated": {"metric": "g", "before": 64, "after": 64}, "steps": {"metric": "s", "before": 9, "after": 9}}}) is None
    True
    """
    engine = entry.get("engine") or {}
    grown = [
        round(engine[role]["after"] - engine[role]["before"])
        for role in ("generated", "steps")
        if role in engine and engine[role].get("before") is not None and engine[role].get("after") is not None
    ]
    if len(grown) < 2 or grown[0] < 1 or grown[1] < 1:
        return None
    return grown[0], grown[1]


def _band_entry(
    manifest: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None, role: str = "band", arm: str | None = None
) -> dict[str, Any] | None:
    """The manifest's record of one band (its ``m_formed`` entry: widths, gauge samples, cache metrics)."""
    for entry in manifest.get("m_formed", []):
        if _matches(entry, prompt_id, c, repeat, role, arm):
            return entry
    return None


def _matches(entry: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None, role: str, arm: str | None) -> bool:
    """Whether an ``m_formed`` entry records this band: an entry without ``prompt_id``, ``repeat`` (or a null one) or ``arm``
    matches any, one without ``role`` is a band's."""
    return (
        entry.get("c") == c
        and str(entry.get("prompt_id", prompt_id)) == prompt_id
        and entry.get("repeat") in (None, repeat)
        and entry.get("role", "band") == role
        and (arm is None or entry.get("arm", arm) == arm)
    )


_ANY = object()  # an entry field left out (or a null repeat): it matches any value asked for


class _BandEntries:
    """The manifest's ``m_formed`` entries indexed by band, for tables that look up every band of a run: ``entry()`` finds
    what :func:`_band_entry` finds (the first entry in the manifest's order that matches), by a few dictionary lookups
    rather than a pass over every entry (a run of 1,024 prompts has 4,096 bands and as many entries).

    Examples
    --------
    >>> manifest = {"m_formed": [{"c": 4, "repeat": 0, "widths": [4]}, {"prompt_id": "p1", "c": 4, "repeat": 0, "widths": [3]}]}
    >>> entries = _BandEntries(manifest)
    >>> entries.entry("p1", 4, 0) is _band_entry(manifest, "p1", 4, 0), entries.entry("p1", 8, 0)
    (True, None)
    """

    def __init__(self, manifest: Mapping[str, Any]) -> None:
        self._manifest = manifest
        self._entries = manifest.get("m_formed", [])  # each read when found (a streamed run's are held as bytes)
        self._by_arm: dict[tuple, int] | None = {}
        self._any_arm: dict[tuple, int] = {}
        try:
            for position, entry in enumerate(self._entries):
                repeat = entry.get("repeat")
                band = (
                    entry.get("c"),
                    str(entry["prompt_id"]) if "prompt_id" in entry else _ANY,
                    _ANY if repeat is None else repeat,
                    entry.get("role", "band"),
                )
                self._by_arm.setdefault((*band, entry.get("arm", _ANY)), position)
                self._any_arm.setdefault(band, position)
        except (
            TypeError,
            AttributeError,
        ):  # a value that cannot be a key (a list where a number belongs): look each band up in turn
            self._by_arm = None

    def entry(
        self, prompt_id: str, c: int, repeat: int | None, role: str = "band", arm: str | None = None
    ) -> dict[str, Any] | None:
        """The band's ``m_formed`` entry, as :func:`_band_entry` finds it."""
        if self._by_arm is None or not isinstance(prompt_id, str):
            return _band_entry(self._manifest, prompt_id, c, repeat, role, arm)
        try:
            keys = [(c, p, r, role) for p in (prompt_id, _ANY) for r in ((_ANY,) if repeat is None else (repeat, _ANY))]
            found = (
                [self._any_arm.get(key) for key in keys]
                if arm is None
                else [self._by_arm.get((*key, a)) for key in keys for a in (arm, _ANY)]
            )
        except TypeError:
            return _band_entry(self._manifest, prompt_id, c, repeat, role, arm)
        positions = [p for p in found if p is not None]
        return self._entries[min(positions)] if positions else None


def _cache_summary(
    manifest: Mapping[str, Any], prompt_id: str, c: int, repeat: int | None, arm: str | None = None
) -> str | None:
    """The prefix-cache metrics around a band, as text: a counter's growth during it, a gauge's value after it.

    Examples
    --------
    >>> entry = {"prompt_id": "p0", "c": 4, "repeat": 0, "cache": {"vllm:prefix_cache_hits_total": {"before": 6.0, "after": 18.0},
    ...                                                              "sglang:cache_hit_rate": {"before": 0.1, "after": 0.5}}}
    >>> _cache_summary({"m_formed": [entry]}, "p0", 4, 0)
    'vllm:prefix_cache_hits_total +12; sglang:cache_hit_rate 0.5'
    """
    return _entry_cache_summary(_band_entry(manifest, prompt_id, c, repeat, arm=arm))


def _entry_cache_summary(entry: Mapping[str, Any] | None) -> str | None:
    """:func:`_cache_summary` of a band's ``m_formed`` entry (None: the band has none)."""
    parts = []
    for name, values in ((entry or {}).get("cache") or {}).items():
        before, after = values.get("before"), values.get("after")
        if name.endswith("_total") and before is not None and after is not None:
            parts.append(f"{name} +{after - before:g}")
        elif after is not None:
            parts.append(f"{name} {after:g}")
    return "; ".join(parts) or None


class CapturesCutShort(UserWarning):
    """A run's capture file ends in a line cut short (no newline, not JSON): that request is left out, the run lacks it,
    and the message says what writes it again for the run's kind (its manifest's producer)."""


def remake_step(manifest: Mapping[str, Any], path: str | Path | None) -> str:
    """What writes a run's missing captures, for what wrote the run (its manifest's ``producer``): a probe is resumed, an
    experiment run again, an assembled run assembled again from its dumps.

    Parameters
    ----------
    manifest : Mapping of str to Any
        The run's manifest.
    path : str, pathlib.Path or None
        The run directory (None: an assembled run not written).

    Returns
    -------
    str

    Examples
    --------
    >>> remake_step({"producer": "bia probe", "url": "http://h:8000/v1/chat/completions"}, "runs/p")
    'bia probe http://h:8000 -o runs/p --resume'
    >>> remake_step({"producer": "bia experiment", "requested": {"kernel_mode": "default"}}, Path("runs/x/default"))
    'run the experiment again: bia experiment -o runs/x --modes default --force, with the options that wrote it'
    >>> remake_step({"assembled_from": [{"source": "a.json"}]}, "runs/a")
    'assemble it again from its dumps: bia assemble DUMP... -o runs/a --force'
    """
    import re

    where = "RUN" if path is None else str(path)
    producer = manifest.get("producer")
    if producer == "bia probe":
        url = manifest.get("url")
        return f"bia probe {re.sub(r'/v1/.*$', '', str(url)) if url else 'URL'} -o {where} --resume"
    if producer == "bia experiment":  # written whole, one folder per kernel mode under -o: run again, not resumed
        mode = (manifest.get("requested") or {}).get("kernel_mode")
        folder = None if path is None else (Path(path) if Path(path).name else Path(path).resolve())
        if not isinstance(mode, str) or folder is None or folder.name != mode:  # renamed: where it lands is said
            return (
                "run the experiment again with the options that wrote it (bia experiment -o OUTPUT --modes MODE --force "
                f"writes OUTPUT/MODE; this run's mode is {mode or 'not recorded'})"
            )
        return f"run the experiment again: bia experiment -o {folder.parent} --modes {mode} --force, with the options that wrote it"
    if manifest.get("assembled_from") is not None:
        return f"assemble it again from its dumps: bia assemble DUMP... -o {where} --force"
    if producer == "bia probe_callable":
        return f"call probe_callable again into {where}"
    return f"write it again with what wrote it ({producer or 'its manifest names no producer'})"
