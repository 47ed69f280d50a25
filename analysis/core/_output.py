"""One rule for every writer: an output that already holds something is refused unless asked.

``bia experiment -o``, ``bia report -o``, ``--notebook``, ``write_witness`` and a run added again to
a study all go through :func:`claim_output`: an existing file, or a folder with anything in it, is
an :class:`OutputExists` error naming it and saying how to overwrite (``--force`` on the command
line, ``force=True`` in Python). ``bia probe`` keeps its own rule: an existing run is resumed
(``--resume``), never overwritten.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


class OutputExists(FileExistsError):
    """The output given already holds a file or a non-empty folder, and overwriting was not asked for.

    Its message says how to overwrite in Python (``force=True``); ``command_line()`` says it in the
    command line's words (``--force``).
    """

    def __init__(self, problem: str, remedy: str | None = None) -> None:
        self.problem, self.remedy = (
            problem,
            remedy,
        )  # remedy: what force does ("overwrite it"), None when it would not help
        super().__init__(self._said("force=True"))

    def _said(self, how: str) -> str:
        return f"{self.problem}; give {how} to {self.remedy}" if self.remedy else self.problem

    def command_line(self) -> str:
        """The message as a command says it: ``give --force`` for ``force=True``."""
        return self._said("--force")


class OutputUnwritable(OutputExists):
    """The output given cannot be written at all: a file stands where a folder above it should be, or that folder refuses
    writing. Said before any work, as :class:`OutputExists` is (``--force`` would not help, so none is offered)."""


def check_writable(path: Path, what: str) -> None:
    """Refuse ``path`` when the nearest folder above it that exists is a file, or cannot be written in.

    Parameters
    ----------
    path : Path
        The file or folder about to be written; it and the folders above it need not exist.
    what : str
        What is written there, for the message (``the report``).

    Raises
    ------
    OutputUnwritable
        A file stands where a folder above ``path`` should be, or that folder cannot be written in.
    """
    above = path.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise OutputUnwritable(f"{path}: {what} cannot be written: {above} is a file, not a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise OutputUnwritable(f"{path}: {what} cannot be written: {above} is not writable (permission denied)")


def _umask() -> int:
    """The process's file-creation mask (read by setting it, then setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file beside it, renamed into place: an error or a kill mid-way leaves
    the old file or none, never half of the new one.

    Parameters
    ----------
    path : str or os.PathLike
        The file; missing folders above it are made, and a file's mode is kept when it is replaced.
    text : str
        What it holds, written as UTF-8.

    Returns
    -------
    Path
        ``path``.

    Examples
    --------
    >>> import tempfile
    >>> target = Path(tempfile.mkdtemp()) / "sub" / "out.json"
    >>> write_atomic(target, "{}").read_text(), [p.name for p in target.parent.iterdir()]
    ('{}', ['out.json'])
    >>> oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # the mode a plain write gives, not a temporary file's 0600
    True
    """
    import tempfile

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = (
        path.stat().st_mode & 0o777 if path.is_file() else 0o666 & ~_umask()
    )  # as a plain open() would leave it, not mkstemp's 0600
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def build_folder(final: Path) -> Iterator[Path]:
    """Build a folder beside ``final`` (``.NAME.partial``) and rename it into place whole when the block ends, so that an error
    or a kill mid-way leaves no half-built folder where ``final`` should be (what an earlier killed attempt left is cleared
    first). ``final`` must be absent or empty: :func:`claim_output` refused or cleared what was there.

    Parameters
    ----------
    final : Path
        Where the folder ends up.

    Yields
    ------
    Path
        The folder to fill, renamed to ``final`` when the block ends without an error.

    Examples
    --------
    >>> import tempfile
    >>> final = Path(tempfile.mkdtemp()) / "run"
    >>> with build_folder(final) as folder:
    ...     _ = (folder / "manifest.json").write_text("{}")
    >>> sorted(p.name for p in final.iterdir()), sorted(p.name for p in final.parent.iterdir())
    (['manifest.json'], ['run'])
    """
    folder = final.with_name(f".{final.name}.partial")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        yield folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    if final.is_dir():
        final.rmdir()
    os.replace(folder, final)


def claim_output(
    path: str | os.PathLike[str], *, force: bool = False, what: str = "output", folder: bool = False
) -> Path:
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
    >>> claim_output(target / "below.html")  # a file where its folder should be: said before any work
    Traceback (most recent call last):
    ...
    analysis.core._output.OutputUnwritable: ...report.html/below.html: output cannot be written: ...report.html is a file, not a folder
    """
    path = Path(path)
    check_writable(path, what)
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
