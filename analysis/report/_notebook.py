"""Running a report notebook: papermill executes it, nbconvert exports it as one offline HTML file."""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..core import write_atomic

DEFAULT_TITLE = "Batch-parity report"


class ReportError(RuntimeError):
    """The report notebook failed; the message carries the notebook's own error."""


def execute_to_html(
    notebook: Path,
    parameters: Mapping[str, Any],
    output: Path,
    *,
    what: str,
    executed_notebook: str | os.PathLike[str] | None = None,
    progress: bool = False,
    timeout_s: int = 600,
) -> Path:
    """Execute ``notebook`` with papermill and write it to ``output`` as one offline HTML file (:func:`export_html`);
    a failing cell is a :class:`ReportError` naming the notebook's own error. ``output`` is already claimed.

    Parameters
    ----------
    notebook : pathlib.Path
        The bundled notebook.
    parameters : mapping of str to object
        The notebook's parameters, injected by papermill.
    output : pathlib.Path
        The HTML file to write.
    what : str
        The report's kind, in errors (``trend``).
    executed_notebook : str or path, optional
        Where to keep the executed notebook; by default a temporary file, removed after.
    progress : bool, default False
        Show papermill's bar over the cells.
    timeout_s : int, default 600
        The longest a cell may run, in seconds.

    Returns
    -------
    pathlib.Path
        ``output``.
    """
    import papermill
    from traitlets.config import Config

    with tempfile.TemporaryDirectory(prefix="bia-report-") as tmp:
        executed = Path(executed_notebook) if executed_notebook else Path(tmp) / notebook.name
        try:
            papermill.execute_notebook(
                str(notebook),
                str(executed),
                parameters=dict(parameters),
                progress_bar=progress,
                cwd=os.getcwd(),
                execution_timeout=timeout_s,
                kernel_name="python3",
                language="python",
                # the kernel talks to this process over Unix sockets, not loopback TCP: ipykernel's "Kernel is running over TCP
                # without encryption" warning, which every report printed, no longer applies (its own advice); its errors still show
                config=Config({"KernelManager": {"transport": "ipc"}}) if os.name == "posix" else Config(),
                # the kernel's own log goes to a file, not the terminal: a Ctrl-C that stops the report while the kernel is
                # answering made it print a zmq traceback; a kernel that dies says why from that file
                kernel_manager_class=_quiet_kernel_manager(Path(tmp) / "kernel.log"),
            )
        except papermill.PapermillExecutionError as exc:
            raise ReportError(f"the {what} notebook failed: {exc.ename}: {exc.evalue}") from None
        except RuntimeError as exc:  # nbclient's DeadKernelError and its start-up time-out: what the kernel said, last
            said = (
                (Path(tmp) / "kernel.log").read_text(errors="replace").strip().splitlines()[-5:]
                if (Path(tmp) / "kernel.log").exists()
                else []
            )
            raise ReportError(
                f"the {what} notebook's kernel failed: {exc}" + (f"; it said: {' | '.join(said)}" if said else "")
            ) from None
        html = export_html(executed)
    write_atomic(output, html)  # a kill or an error while writing leaves no half-written report
    return output


def _quiet_kernel_manager(log: Path) -> type:
    """The kernel manager papermill uses, with the kernel's stderr appended to ``log`` instead of the terminal's."""
    from jupyter_client import AsyncKernelManager

    class QuietKernelManager(AsyncKernelManager):
        async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
            env = kernel_environment(kw.get("env") or os.environ)
            with log.open("ab") as stderr:  # the kernel holds its own copy of the file once launched
                await super()._async_launch_kernel(kernel_cmd, **{**kw, "stderr": stderr, "env": env})

    return QuietKernelManager


# polars' allocator (jemalloc) keeps freed pages for ten seconds by default, so a report's kernel held, at any time, the
# pages of every section it ran in the last ten, not only what lived (benchmarks/bench_scale.py, report-warm, the process
# tree: 552 to 580 MB and 990 MB at 129,000 and 516,000 requests with jemalloc's default; 559 MB and 906 to 947 MB with
# the kernel's pages given back at once, 16 s and 23 to 28 s, as fast as before within the runs' spread).
_PAGES_GIVEN_BACK = "dirty_decay_ms:0,muzzy_decay_ms:0"


def kernel_environment(environment: Mapping[str, str]) -> dict[str, str]:
    """The environment a report's kernel runs in: this one, with polars' allocator giving freed pages back at once unless
    the user configured it (``_RJEM_MALLOC_CONF``).

    Parameters
    ----------
    environment : mapping of str to str
        The environment the kernel would get.

    Returns
    -------
    dict of str to str

    Examples
    --------
    >>> kernel_environment({"PATH": "/bin"})["_RJEM_MALLOC_CONF"]
    'dirty_decay_ms:0,muzzy_decay_ms:0'
    >>> kernel_environment({"_RJEM_MALLOC_CONF": "narenas:1"})["_RJEM_MALLOC_CONF"]
    'narenas:1'
    """
    return {"_RJEM_MALLOC_CONF": _PAGES_GIVEN_BACK, **environment}


def export_html(notebook: str | os.PathLike[str]) -> str:
    """Export an executed notebook as self-contained HTML: code hidden, nothing from the network.

    Parameters
    ----------
    notebook : str or path
        The executed ``.ipynb``.

    Returns
    -------
    str
        The page's HTML.
    """
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name="bia",
        extra_template_basedirs=[str(Path(__file__).parent / "nbconvert")],  # the page around the notebook's output
        exclude_input=True,
        exclude_markdown=True,  # the notebook's opening words are for the reader of the .ipynb: the HTML opens with its answer
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    node = nbformat.read(os.fspath(notebook), as_version=4)
    # the page's <title> is the report's: papermill keeps the parameters it injected in the notebook's metadata
    title = (node.metadata.get("papermill") or {}).get("parameters", {}).get("title") or node.metadata.get(
        "title", DEFAULT_TITLE
    )
    node.metadata["title"] = title  # the lab template prefers the notebook's own title to the resources' name
    body, _ = exporter.from_notebook_node(node, resources={"metadata": {"name": title}})
    return body


def _once(given: Iterable[Any], what: str) -> list[str]:
    """The sources or runs given, each once (a repeat is said, as a warning, and left out)."""
    from ..io import SourceRepeated, same_sources

    kept, repeated = same_sources(given)
    for first, again in repeated:
        warnings.warn(f"{what} {again} is {first} given again; it is read once", SourceRepeated, stacklevel=3)
    return kept
