"""``bia certify URL``: probe a live server with the requests the bound needs, stop once the verdict is known, certify the run."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import typer

from ..core import OutputExists
from ._args import EXIT_UNREACHABLE, _fail, _parse_ladder, _read_lines


def claim_certificate(output: Path, *, force: bool) -> None:
    """Check that the certificate may be written at ``output``: a new file, an earlier certificate (replaced, so that
    certifying again in the same folder works), or, with ``force``, any file.

    Parameters
    ----------
    output : Path
        The certificate's path (``-o``).
    force : bool
        Replace any file there (``--force``).

    Raises
    ------
    OutputExists
        Another file is there and ``force`` is not given, or a folder is.
    """
    from ..core import claim_output

    claim_output(output, force=force or _is_certificate(output), what="-o")


def _is_certificate(path: Path) -> bool:
    """Whether ``path`` is a certificate bia certify wrote (a JSON object with ``certificate_version``)."""
    try:
        with path.open("rb") as handle:
            document = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(document, dict) and "certificate_version" in document


def _run_folder(given: Path | None, *, force: bool) -> Path:
    """Where the probe writes: ``given`` (an earlier run there replaced with ``force``, anything else refused), or a new
    ``runs/certify-YYYYMMDD-HHMMSS`` so that every certification keeps its own run."""
    from ..core import claim_output

    if given is None:
        stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
        folder = Path("runs") / f"certify-{stamp}"
        for count in range(2, 1000):
            if not folder.exists():
                break
            folder = Path("runs") / f"certify-{stamp}-{count}"
        return claim_output(folder, what="--run", folder=True)
    replaceable = (given / "manifest.json").is_file()  # a run: what a probe writes, and so may write again
    if given.is_dir() and any(given.iterdir()) and not replaceable:
        raise OutputExists(f"{given}: --run holds files that are not a run; give a new folder (or leave --run out)")
    return claim_output(given, force=force and replaceable, what="--run", folder=True)


def certify_url(
    url: str,
    *,
    run_dir: Path | None,
    output: Path,
    force: bool,
    target_rate: float,
    confidence: float,
    ladder: str,
    prompts: Path | None,
    max_tokens: int,
    max_requests: int | None,
    max_time: float | None,
    server_log: Path | None,
    print_lines: Callable[[dict, Path], None],
    refire: int = 2,
    wait: float = 60.0,
) -> None:
    """Probe ``url`` into ``run_dir``, write the certificate to ``output``, say it with ``print_lines`` (bia certify's) and exit
    with the verdict's code.

    Parameters
    ----------
    url : str
        The server's http(s) address.
    run_dir : Path, optional
        The run directory the probe writes (``--run``): an earlier run there is replaced with ``force``, anything else
        refused; a new ``runs/certify-YYYYMMDD-HHMMSS`` when None.
    output : Path
        The certificate to write (``-o``); an earlier certificate there is replaced.
    force : bool
        Overwrite ``output`` when it is some other file, and an earlier run at ``run_dir``.
    target_rate : float
        GREEN needs the upper bound on the divergence rate below this rate.
    confidence : float
        The confidence of that one-sided bound.
    ladder : str
        The batch sizes, comma separated, as ``--ladder`` gives them.
    prompts : Path, optional
        A text file of prompts, one per line; bia's own prompts when None.
    max_tokens : int
        Tokens per request.
    max_requests : int, optional
        At most this many batched requests (the bound's number when None).
    max_time : float, optional
        Seconds after which probing stops and what came back is judged.
    server_log : Path, optional
        The server's log, for the batch widths it formed.
    print_lines : callable
        Says the certificate (its document, and where it was written) to the user.
    refire : int, default 2
        How many times a band seen formed narrower than its c is fired again (``--refire``).
    wait : float, default 60
        Seconds to wait for a server that is starting (``--wait``), with one line on stderr while it waits.

    Raises
    ------
    typer.Exit
        Always: the verdict's exit code, 2 for a bad option or an occupied output, 6 when nothing answers at ``url``,
        130 when interrupted.
    """
    from ..core import duration, write_atomic
    from ..experiment import DEFAULT_PROMPTS
    from ..probe import ProbeError, ProbeSettings, ServerGone, ServerUnreachable, certify_server, planned_repeats
    from ..studies import certificate_document

    texts = list(DEFAULT_PROMPTS) if prompts is None else _read_lines(prompts, "--prompts")
    steps = _parse_ladder(ladder)
    try:
        claim_certificate(output, force=force)
        run_dir = _run_folder(run_dir, force=force)
        repeats = planned_repeats(
            target_rate=target_rate, confidence=confidence, ladder=steps, prompts=len(texts), max_requests=max_requests
        )
        settings = ProbeSettings(
            prompts=texts,
            ladder=steps,
            max_tokens=max_tokens,
            server_log=server_log,
            refire=refire,
            progress=sys.stderr.isatty(),
        )
    except (OutputExists, ProbeError) as exc:
        raise _fail(exc) from None
    batched = repeats * len(texts) * sum(c for c in steps if c > 1)
    contexts = repeats * len(texts) * sum(c - 1 for c in steps if c > 1)
    plan = (
        f"up to {batched} batched requests, {contexts} of them in distinct batch contexts ({len(texts)} prompts x "
        f"c={','.join(map(str, steps))} x {repeats} repeats, a companion that moves each repeat) into {run_dir}; "
        "it stops at the first request that parts"
    )
    if (
        sys.stderr.isatty()
    ):  # beside the bars; a log gets it with the verdict, so that a fault found first stays its one line
        typer.echo(f"certifying {url}: {plan}", err=True)
    try:
        folder, judgement, stopped = asyncio.run(
            certify_server(
                url,
                run_dir,
                settings,
                target_rate=target_rate,
                confidence=confidence,
                max_requests=max_requests,
                max_time=max_time,
                wait=wait,
                on_wait=lambda: typer.echo(f"waiting up to {duration(wait)} for {url} to answer (--wait)", err=True),
            )
        )
    except (ServerUnreachable, ServerGone) as exc:
        raise _fail(exc, EXIT_UNREACHABLE) from None
    except (ProbeError, ValueError) as exc:
        raise _fail(exc) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {run_dir} stays readable; bia certify {run_dir} judges what it holds", err=True)
        raise typer.Exit(130) from None
    typer.echo(f"probed {url}: {plan}", err=True)
    if stopped:
        said = (
            "a request parted, so the verdict is RED whatever follows"
            if stopped == "RED"
            else f"--max-time {duration(max_time)} ran out"
        )
        typer.echo(f"stopped early: {said}", err=True)
    document = certificate_document(judgement, target_rate=target_rate, confidence=confidence)
    document["probe"] = {
        "url": url,
        "run": str(folder),
        "planned_batched_requests": batched,
        "planned_contexts": contexts,
        "stopped": stopped,
    }
    write_atomic(output, json.dumps(document, indent=2) + "\n")
    print_lines(document, output)
    raise typer.Exit(document["exit_code"])
