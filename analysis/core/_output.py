"""One rule for every writer: an output that already holds something is refused unless asked.

``bia experiment -o``, ``bia report -o``, ``--notebook``, ``write_witness`` and a run added again to
a study all go through :func:`claim_output`: an existing file, or a folder with anything in it, is
an :class:`OutputExists` error naming it and saying how to overwrite (``--force`` on the command
line, ``force=True`` in Python). ``bia probe`` keeps its own rule: an existing run is resumed
(``--resume``), never overwritten.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path


class OutputExists(FileExistsError):
    """The output given already holds a file or a non-empty folder, and overwriting was not asked for.

    Its message says how to overwrite in Python (``force=True``); ``command_line()`` says it in the
    command line's words (``--force``).
    """

    def __init__(self, problem: str, remedy: str | None = None) -> None:
        self.problem, self.remedy = problem, remedy  # remedy: what force does ("overwrite it"), None when it would not help
        super().__init__(self._said("force=True"))

    def _said(self, how: str) -> str:
        return f"{self.problem}; give {how} to {self.remedy}" if self.remedy else self.problem

    def command_line(self) -> str:
        """The message as a command says it: ``give --force`` for ``force=True``."""
        return self._said("--force")


def claim_output(path: str | os.PathLike[str], *, force: bool = False, what: str = "output", folder: bool = False) -> Path:
    """Check that ``path`` may be written; with ``force``, clear what is there first.

    Parameters
    ----------
    path : path
        The file or folder about to be written.
    force : bool
        Overwrite: a file is left to be replaced, a folder is emptied.
    what : str
        How the output is named in the error.
    folder : bool
        The output is a folder (an existing file there is refused even with ``force``).

    Returns
    -------
    Path
        ``path``.

    Examples
    --------
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "report.html"
    >>> claim_output(target) == target
    True
    >>> _ = target.write_text("yesterday")
    >>> claim_output(target)
    Traceback (most recent call last):
    ...
    analysis.OutputExists: ...report.html: output already exists; give force=True to overwrite it
    >>> claim_output(target, force=True) == target
    True
    """
    path = Path(path)
    if folder and path.exists() and not path.is_dir():
        raise OutputExists(f"{path}: {what} must be a folder, and a file is there")
    if not folder and path.is_dir():
        raise OutputExists(f"{path}: {what} is a folder; give a file name")
    occupied = path.is_file() or (path.is_dir() and any(path.iterdir()))
    if occupied and not force:
        raise OutputExists(f"{path}: {what} already exists", "overwrite it")
    if occupied and folder:
        shutil.rmtree(path)
    return path
