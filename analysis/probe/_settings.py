"""The probe's options in one object: what :func:`analysis.probe.probe`, ``dry_run``, ``certify_server`` and ``bia probe`` share,
with their defaults and the checks that refuse settings no run can be made of."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from ._arms import check_arms
from ._bands import REFIRE, REFIRE_S
from ._checks import check_settings, check_timeout
from ._rundir import ProbeError
from ._widths import BATCH_LINE


@dataclasses.dataclass(frozen=True)
class ProbeSettings:
    """How a live server is probed: the prompts, the ladder of batch sizes, the request, what is watched and how a run is resumed.

    Every keyword of :func:`analysis.probe.probe` but ``say`` is a field, with the same default. The settings are checked once,
    when the object is made (a :class:`~analysis.ProbeError` names the first that no run can be made of); with ``resume`` only
    ``timeout`` is, since a resumed run keeps the settings its manifest recorded. Sequences are kept as tuples and ``expect`` as a
    dict, so two settings made from lists and from tuples are equal. ``api_key`` is left out of the repr.

    Parameters
    ----------
    prompts : sequence of str or mapping
        Texts, or ``{"text": ..., "answer": ...}`` mappings whose answers :func:`analysis.run.accuracy_table` scores. One at least,
        unless ``resume``.
    ladder : sequence of int
        The batch sizes c; each band sends c requests at once.
    repeats : int
        How many times each band is fired, interleaved across c.
    max_tokens, top_logprobs, seed : int
        The greedy request's length, its candidates per step (0 to 20) and its seed (the needle positions' too).
    layout : {"copies", "needle", "rotating"}
        c copies of the prompt; the prompt at a seeded position among c - 1 ``fillers``; or c - 1 copies and one filler
        whose row and text change from repeat to repeat, so that each repeat is a new batch context
        (``analysis.run.rotating_batch``: what ``bia certify URL`` fires).
    fillers : sequence of str
        The needle and rotating layouts' other prompts (the set's other prompts, else bia's, when empty).
    arms : sequence of str, optional
        Control arms fired for each prompt instead of ``layout`` (``repeat``, ``copies``, ``mixed``, ``prefix``, ``cache``,
        ``serial``, ``prefill``).
    observer : bool
        Also fire each band without logprobs, so that the texts can be compared.
    engine : str
        ``auto`` (detected from read-only endpoints), or one of ``vllm``, ``sglang``, ``llamacpp``, ``apr``, ``bia``, ``openai``.
    model : str, optional
        The model name to send (the server's first model by default).
    server_log : path, optional
        The server's log, whose lines give the batch width of every step; ``log_pattern`` is the regex whose group 1 is a width.
    metrics : bool
        Sample the running-requests gauge, and read the cache and decode counters, on ``/metrics`` around each band, every
        ``metrics_interval`` seconds.
    timeout : float
        Seconds each whole request may take, its stream included.
    refire : int
        How many times a band whose width evidence shows a batch narrower than its c is fired again (the last attempt is
        kept; the band's ``m_formed`` entry lists them all as ``attempts``); 0 never.
    refire_s : float
        No band is fired again once its attempts have taken this many seconds.
    declared_min : int, optional
        Tokens the two m=1 references must agree on before a prompt's bands are run (``min(64, max_tokens)`` by default),
        unless ``bands_anyway``.
    expect : mapping
        Settings the server should report about itself (``{"kernel_mode": "batch-invariant"}``), checked and recorded.
    api_key : str, optional
        Sent as a bearer token on every request; never written into the run.
    resume, retry_refused : bool
        Finish the run in the output folder with its own settings; with ``retry_refused`` also fire again the bands that had a
        request refused.
    progress : bool, optional
        Bars on stderr; by default only in a terminal.

    Raises
    ------
    ProbeError
        A setting no run can be made of: an empty prompt set, a ladder with a c below 1, a band wider than this process may hold
        open, ``top_logprobs`` past 20, an unknown layout or arm, a ``declared_min`` no reference could reach, a time-out that is
        not a positive number.

    Examples
    --------
    >>> from analysis.probe import ProbeSettings
    >>> settings = ProbeSettings(prompts=["If the argument is"], ladder=[1, 4], max_tokens=32)
    >>> settings.ladder, settings.repeats, settings.timeout
    ((1, 4), 1, 120.0)
    >>> settings.replace(repeats=3).repeats  # a copy with other values, checked again
    3
    >>> ProbeSettings(prompts=["x"], max_tokens=8, declared_min=9)
    Traceback (most recent call last):
    ...
    analysis.ProbeError: declared_min must be between 0 and max_tokens=8, got 9: no reference could reach it

    The same settings serve a probe, its dry run, and a certificate's probe
    (``asyncio.run(analysis.probe.probe(url, "runs/probe", settings))``).
    """

    prompts: Sequence[str | Mapping[str, Any]] = ()
    ladder: Sequence[int] = (1, 4, 8, 16)
    repeats: int = 1
    max_tokens: int = 64
    top_logprobs: int = 5
    seed: int = 0
    layout: str = "copies"
    fillers: Sequence[str] = ()
    arms: Sequence[str] | None = None
    observer: bool = False
    engine: str = "auto"
    model: str | None = None
    server_log: str | os.PathLike[str] | None = None
    log_pattern: str = BATCH_LINE
    metrics: bool = True
    metrics_interval: float = 0.01
    timeout: float = 120.0
    refire: int = REFIRE
    refire_s: float = REFIRE_S
    declared_min: int | None = None
    expect: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    bands_anyway: bool = False
    api_key: str | None = dataclasses.field(default=None, repr=False)
    resume: bool = False
    retry_refused: bool = False
    progress: bool | None = None

    def __post_init__(self) -> None:
        check_timeout(self.timeout)
        if isinstance(self.refire, bool) or not isinstance(self.refire, int) or self.refire < 0:
            raise ProbeError(f"refire must be a whole number of times >= 0, got {self.refire!r}")
        if isinstance(self.refire_s, bool) or not isinstance(self.refire_s, (int, float)) or not self.refire_s >= 0:
            raise ProbeError(f"refire_s must be a number of seconds >= 0, got {self.refire_s!r}")
        if not self.resume:  # a resumed run keeps its manifest's settings: these are not the run's
            check_settings(self.prompts, self.ladder, self.repeats, self.max_tokens, self.top_logprobs, self.layout)
            check_arms(self.arms, layout=self.layout)
            if self.declared_min is not None and not 0 <= self.declared_min <= self.max_tokens:
                raise ProbeError(
                    f"declared_min must be between 0 and max_tokens={self.max_tokens}, got {self.declared_min}: "
                    "no reference could reach it"
                )
        for name in ("prompts", "ladder", "fillers", "arms"):
            value = getattr(self, name)
            if value is not None and not isinstance(
                value, (str, tuple)
            ):  # a str is refused above, never split into letters
                object.__setattr__(self, name, tuple(value))
        if self.fillers is None:
            object.__setattr__(self, "fillers", ())
        object.__setattr__(self, "expect", dict(self.expect or {}))

    def replace(self, **changes: Any) -> ProbeSettings:
        """A copy with ``changes`` (field names as keywords), checked again; an unknown name is a TypeError that
        names it.

        Parameters
        ----------
        **changes
            New values for fields of the settings, by field name.

        Returns
        -------
        ProbeSettings

        Raises
        ------
        TypeError
            A name that is not a field.
        ProbeError
            Changed settings no run can be made of.
        """
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"ProbeSettings has no option {unknown[0]!r}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def of(cls, settings: ProbeSettings | None = None, /, **options: Any) -> ProbeSettings:
        """``settings`` with ``options`` over it, or settings made of ``options`` alone: how the probe's functions
        take both.

        Parameters
        ----------
        settings : ProbeSettings, optional
            The settings to start from (positional only); without them the settings are made of ``options`` alone.
        **options
            Fields of :class:`ProbeSettings` by name, over ``settings`` or over the defaults.

        Returns
        -------
        ProbeSettings

        Raises
        ------
        TypeError
            ``settings`` that is not a ProbeSettings, or an option that is not a field.
        """
        if settings is None:
            unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
            if unknown:  # the TypeError a function's own keyword would raise
                raise TypeError(f"unexpected keyword argument {unknown[0]!r} (not a ProbeSettings option)")
            return cls(**options)
        if not isinstance(settings, ProbeSettings):
            raise TypeError(f"settings: expected a ProbeSettings, got {type(settings).__name__}")
        return settings.replace(**options) if options else settings
