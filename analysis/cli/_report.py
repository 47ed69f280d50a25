"""``bia report``: the parity report notebook executed (papermill) and exported as one offline HTML file."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ..core import OutputExists
from ..verdicts import EXIT_RED, V3Policy
from ._args import _check_epsilon, _fail, _go_offline, _policy, _quiet_after_interrupt, _sources, _unread
from ._assemble import _assemble
from ._options import BandPerFile, Bands, MappingFile, ModelPrefix, Offline, PolicyFile


def report_command(
    sources: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SOURCE...",
            help="Witness sources, run directories and dumps (files, folders, globs); the embedded default if none.",
        ),
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path(
        "parity-report.html"
    ),
    epsilon: Annotated[float, typer.Option(help="The near-tie epsilon for runs.")] = 0.05,
    reference: Annotated[
        str,
        typer.Option(
            metavar="REFERENCE", help="Compare batched requests with ref1, ref2, or another run directory's ref #1."
        ),
    ] = "ref1",
    title: Annotated[str, typer.Option(help="The report's title.")] = "Batch-parity report",
    notebook: Annotated[Path | None, typer.Option(help="Also keep the executed notebook here.")] = None,
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    bands: Bands = None,
    admission: Annotated[
        bool,
        typer.Option(
            "--admission",
            help="Judge the runs by aprender's V3 release gate too (implied by --policy, --model-prefix and --bands).",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite the output (and --notebook) when they exist.")
    ] = False,
    mapping: MappingFile = None,
    band_per_file: BandPerFile = False,
    offline: Offline = False,
) -> None:
    """Execute the parity report notebook (papermill) and export one offline HTML file.

    The verdict cards come first, then the figures and the detail; aprender's V3 release gate
    judges the witnesses, and the runs too when --policy, --model-prefix or --bands is given.
    Dumps are assembled into a run first, as bia assemble does (--mapping, --band-per-file).
    """
    import dataclasses
    import tempfile

    _go_offline(offline)
    from ..core import claim_output
    from ..report import REPORT_READS, is_lone

    _check_epsilon(epsilon)
    policy = _policy(policy_file, model_prefix, None, bands, None, None, None, None)
    try:  # before the notebook runs for a minute: a report never lands on something it was not asked to replace
        claim_output(output, force=force, what="-o")
        if notebook is not None:
            claim_output(notebook, force=force, what="--notebook")
    except OutputExists as exc:
        raise _fail(exc) from None
    runs, witness_sources, dumps = [], [], []
    if sources:  # the embedded default only when nothing at all is given: a folder with nothing to read is exit 3
        given = _sources(sources, REPORT_READS, "report")
        runs, witness_sources, dumps = given.runs, given.witnesses, given.dumps
    if band_per_file and not dumps and mapping is None:
        raise _fail("--band-per-file places dumps, and no dump was given")
    assembled = _assemble(dumps, mapping, band_per_file) if dumps or mapping is not None else None
    if assembled is not None and is_lone(assembled):
        typer.echo(
            "note: one request allows no batch comparison; the report says what it can and cannot judge", err=True
        )
    with tempfile.TemporaryDirectory(prefix="bia-report-") as scratch:
        if assembled is not None:
            from ..run import write_run

            name = f"{Path(dumps[0]).name if len(dumps) == 1 and mapping is None else 'dumps'} (assembled)"
            labelled = dataclasses.replace(
                assembled, manifest={**assembled.manifest, "label": name}
            )  # the scratch folder goes
            runs.append(str(write_run(labelled, Path(scratch) / name)))
        _report(
            runs,
            witness_sources,
            output=output,
            epsilon=epsilon,
            reference=reference,
            title=title,
            notebook=notebook,
            policy=policy,
            policy_file=policy_file,
            model_prefix=model_prefix,
            bands=bands,
            admission=admission,
            embedded=not sources,
        )


def _report(
    runs: list[str],
    witness_sources: list[str],
    *,
    output: Path,
    epsilon: float,
    reference: str,
    title: str,
    notebook: Path | None,
    policy: V3Policy,
    policy_file: Path | None,
    model_prefix: str | None,
    bands: str | None,
    admission: bool,
    embedded: bool,
) -> None:
    """Read the runs and witnesses, so that a bad file is named here, then render the report (over the embedded default
    when ``embedded``: nothing was given)."""
    import dataclasses

    from ..core import WitnessError, trim_heap
    from ..io import SourceError, default_runs, default_sources
    from ..report import ACCEPTS, ReportError, render_report
    from ..witness import read_witnesses

    try:  # read here first, so a bad file is named directly rather than from inside a kernel
        from ..run import RunError
        from ..studies import prepare_runs

        prepare_runs(default_runs() if embedded else runs)  # parsed into pieces here, which the kernel then reads
        read_witnesses(default_sources() if embedded else witness_sources, progress=sys.stderr.isatty())
    except (FileNotFoundError, IsADirectoryError, SourceError) as exc:
        raise _unread(exc) from None
    except (WitnessError, RunError, ValueError) as exc:
        hint = f"; {ACCEPTS}" if isinstance(exc, WitnessError) and "neither a witness" in str(exc) else ""
        typer.echo(f"error: {exc}{hint}", err=True)
        raise typer.Exit(EXIT_RED) from None
    trim_heap()  # what reading freed (the manifests' Python objects) is not held while the kernel runs
    overrides = {k: v for k, v in dataclasses.asdict(policy).items() if v != getattr(V3Policy(), k)}
    try:
        asked = (
            admission or policy_file is not None or model_prefix is not None or bands is not None
        )  # then the runs meet aprender's gate too
        with _quiet_after_interrupt():
            written = render_report(
                witness_sources,
                output,
                runs=runs,
                epsilon=epsilon,
                reference=reference,
                title=title,
                policy=overrides,
                admission=asked,
                executed_notebook=notebook,
                force=True,
            )  # claimed above
    except ReportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {written}")
