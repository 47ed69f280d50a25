"""``bia certify``: a GREEN/AMBER/RED/UNVERIFIED certificate per run and arm, written as certificate.json, with an exit code for CI."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Annotated

import typer

from ..core import OutputExists
from ..verdicts import EXIT_RED
from ._args import _fail, _sources
from ._certify_url import claim_certificate

_STYLE = {"GREEN": "green", "AMBER": "yellow", "UNVERIFIED": "magenta", "RED": "red"}


def certify_command(
    ctx: typer.Context,
    runs: Annotated[list[str], typer.Argument(metavar="RUN...", help="Run directories, or folders that hold them.")],
    target_rate: Annotated[
        float,
        typer.Option(
            metavar="RATE", help="GREEN needs the upper bound on the divergence rate below this rate (0.01: 1%)."
        ),
    ] = 0.01,
    confidence: Annotated[
        float, typer.Option(metavar="P", help="The confidence of that one-sided bound (0.95: 95%).")
    ] = 0.95,
    output: Annotated[Path, typer.Option("-o", "--output", help="The certificate to write (JSON).")] = Path(
        "certificate.json"
    ),
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Overwrite the output when it is not an earlier certificate (one is always replaced)."
        ),
    ] = False,
    run: Annotated[
        Path | None,
        typer.Option(
            "--run",
            help="With a URL: the run directory the probe writes (a new runs/certify-YYYYMMDD-HHMMSS by default; "
            "--force replaces an earlier run there).",
        ),
    ] = None,
    wait: Annotated[
        float,
        typer.Option(
            min=0,
            metavar="SECONDS",
            help="With a URL: wait this long for a server that is starting (refusing connections, or answering 503).",
        ),
    ] = 60.0,
    ladder: Annotated[str, typer.Option(metavar="C,C,...", help="With a URL: the batch sizes.")] = "1,4,8,16",
    prompts: Annotated[
        Path | None, typer.Option(help="With a URL: a text file of prompts, one per line (bia's two by default).")
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="With a URL: tokens per request.")] = 64,
    max_requests: Annotated[
        int | None,
        typer.Option(
            metavar="N", help="With a URL: at most this many batched requests (the bound's number by default)."
        ),
    ] = None,
    max_time: Annotated[
        float | None,
        typer.Option(metavar="SECONDS", help="With a URL: stop probing after this long and judge what came back."),
    ] = None,
    server_log: Annotated[
        Path | None, typer.Option(help="With a URL: the server's log, for the batch widths it formed.")
    ] = None,
    refire: Annotated[
        int,
        typer.Option(
            min=0,
            metavar="N",
            help="With a URL: fire a band again, up to N times (within 60 s), when its widths show it formed narrower "
            "than its c; the last attempt is kept.",
        ),
    ] = 2,
) -> None:
    """Certify runs batch invariant: one verdict per run and arm, GREEN, AMBER, RED or UNVERIFIED, written as certificate.json.

    GREEN: every request bit-identical to m=1, every batch seen formed at its c, and enough requests that the
    one-sided upper bound on the divergence rate (exact Clopper-Pearson) is below --target-rate. AMBER: the same,
    with too few requests for that bound. RED: a request's tokens or logprob bits part from m=1 (the first named).
    UNVERIFIED: nothing parted, but a c > 1 of the ladder is missing or incomplete, a batch was never seen formed at its c,
    or the bits were not recorded. A server that differs from itself alone (its m=1 references, or c=1) is RED for
    run-to-run drift, and its batching is not judged. Only batched requests (c > 1) count toward the bound.

    Given a server's URL instead, it probes it first (into --run) with as many batched requests as the bound needs
    in distinct batch contexts (bia's prompts at every c of --ladder, c - 1 copies and a companion whose row and text
    change with every repeat), fires a band that formed narrower than its c again (--refire), stops at the first request
    that parts, or at --max-requests or --max-time, and certifies what came back.

    An earlier certificate at -o is replaced; any other file there needs --force. Each certification of a URL probes into
    a new run directory, unless --run names one (an earlier run there is replaced with --force).

    Exit 0 all GREEN; else the worst verdict's: 5 RED, 7 UNVERIFIED, 8 AMBER. Exit 2 a bad option or an occupied
    output, 6 a URL nothing answers at (after --wait), 3 no such path or a folder that holds no run (as bia report and bia witness say of a folder with
    nothing to read), 4 not a run bia reads.
    """
    from ..core import write_atomic
    from ..dumps import DumpError
    from ..run import RunError
    from ..studies import certificate_document, judge_runs

    if not (math.isfinite(target_rate) and 0 < target_rate <= 1):
        raise _fail(f"--target-rate takes a rate in (0, 1], got {target_rate!r}")
    if not (math.isfinite(confidence) and 0 < confidence < 1):
        raise _fail(f"--confidence takes a probability in (0, 1), got {confidence!r}")
    urls = [
        given for given in runs if re.match(r"[a-z][a-z0-9+.-]*://", given, flags=re.I)
    ]  # as text: a Path folds "//"
    if urls and (len(runs) > 1 or not urls[0].lower().startswith(("http://", "https://"))):
        raise _fail(f"{urls[0]}: bia certify takes one http(s) URL to probe, or run directories, not both")
    if urls:
        from ._certify_url import certify_url

        return certify_url(
            urls[0],
            run_dir=run,
            wait=wait,
            output=output,
            force=force,
            target_rate=target_rate,
            confidence=confidence,
            ladder=ladder,
            prompts=prompts,
            max_tokens=max_tokens,
            max_requests=max_requests,
            max_time=max_time,
            server_log=server_log,
            refire=refire,
            print_lines=_print_lines,
        )
    _refuse_url_options(ctx)
    try:
        claim_certificate(output, force=force)
    except OutputExists as exc:
        raise _fail(exc) from None
    # a stray file in a folder: a note, not a failure; each run is judged from its directory a piece at a time
    folders = _sources(runs, frozenset({"run"}), "certify").runs
    try:
        judgement = judge_runs(folders, target_rate=target_rate, confidence=confidence)
    except (RunError, DumpError) as exc:  # a capture no table can be built from: one line, never a traceback
        raise _fail(
            f"{exc}; bia certify reads run directories (bia probe, bia experiment, bia assemble)", EXIT_RED
        ) from None
    document = certificate_document(judgement, target_rate=target_rate, confidence=confidence)
    write_atomic(output, json.dumps(document, indent=2) + "\n")
    _print_lines(document, output)
    raise typer.Exit(document["exit_code"])


# The options that shape a probe of a URL, by parameter name: given with run directories, they would change nothing
_URL_ONLY = ("run", "ladder", "prompts", "max_tokens", "max_requests", "max_time", "server_log", "refire", "wait")


def _refuse_url_options(ctx: typer.Context) -> None:
    """Exit 2 for an option given that applies only with a URL, rather than ignore it with run directories (the first
    named; an option left at its default is not given)."""
    for name in _URL_ONLY:
        # by name: typer may carry its own copy of click's ParameterSource
        if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT":
            option = next(p for p in ctx.command.params if p.name == name).opts[-1]
            raise _fail(f"{option} applies only with a URL to probe; bia certify was given run directories")


def _print_lines(document: dict, output: Path) -> None:
    """One line per run and arm, its verdict coloured, then where the certificate went."""
    from rich.console import Console
    from rich.markup import escape

    from ..studies import domain_words, repro_step

    console = Console(soft_wrap=True)
    for arm in document["arms"]:
        verdict = arm["verdict"]
        console.print(
            f"[{_STYLE[verdict]}]{verdict}[/] {escape(arm['run'])} ({escape(arm['arm'])}): {escape(arm['reason'])}"
        )
        console.print(f"  next: {escape(arm['next_step'])}")
        if verdict == "RED" and Path(arm["run"]).is_dir():  # what to hand the engine's maintainers (bia repro)
            console.print(f"  repro: {escape(repro_step(arm['run'], (document.get('probe') or {}).get('url')))}")
    console.print(f"wrote {escape(str(output))}: {document['verdict']}, exit {document['exit_code']}")
    if document.get("domain"):  # the last line: what the verdict covers, and so what it does not
        console.print(escape(domain_words(document["domain"])))
