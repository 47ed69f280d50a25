"""One step of a run's plan (:class:`Unit`) and the plan's defaults: below the layout and the arms, which both build units."""

from __future__ import annotations

from dataclasses import dataclass

_DEFAULTS = {"ladder": [1, 4, 8, 16], "declared_min": 64, "max_constant_run": 16}


@dataclass(frozen=True)
class Unit:
    """One step of a run's plan: a reference request, or one band (or its observer twin) of c requests released together.

    ``slots`` are the requests recorded as the unit's own: all c in the copies layout, the target
    (slot 0) alone in the needle layout, where the others are fillers. ``arm`` names the control arm
    of a run probed with ``arms`` (see ``analysis.run._arms``); None in a run made before arms
    existed, and for the m=1 references, which every arm shares.
    """

    prompt_id: str
    role: str  # "reference" | "band" | "observer" | "prefill"
    c: int | None
    repeat: int
    slots: tuple[int, ...]
    arm: str | None = None

    @property
    def key(self) -> str:
        """A stable name, as the manifest's ``done`` list and each capture's ``unit`` field hold it.

        The copies arm keeps the names runs had before arms, so a copies run reads the same either way.

        Examples
        --------
        >>> Unit("p0", "band", 4, 0, (0, 1, 2, 3), "copies").key, Unit("p0", "band", 4, 0, (0,), "mixed").key
        ('p0/band/c4/r0', 'p0/mixed/band/c4/r0')
        """
        if self.role == "reference":
            return f"{self.prompt_id}/reference/s{self.slots[0]}"
        if self.role == "prefill":  # one unit per prompt: its slots are the completion's positions scored as a prompt
            return f"{self.prompt_id}/prefill/r{self.repeat}"
        arm = f"{self.arm}/" if self.arm not in (None, "copies") else ""
        return f"{self.prompt_id}/{arm}{self.role}/c{self.c}/r{self.repeat}"

    def capture_name(self, slot: int) -> str:
        """The file name (without suffix) of one request's partial capture.

        Parameters
        ----------
        slot : int
            The request's slot in the unit.

        Returns
        -------
        str
            The unit's key with ``.`` for ``/``, then ``.s<slot>``.
        """
        return f"{self.key.replace('/', '.')}.s{slot}"
