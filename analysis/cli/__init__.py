"""The ``bia`` command line: one typer command per subcommand; what they share (errors, exit codes, parsing) is in ``_args``."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..core._output import OutputExists
from ..verdicts._v3 import EXIT_MISSING, EXIT_RED, V3Policy, shape_check
from ._help import Command, Group
from ._certify import certify_command
from ._args import (EXIT_UNREACHABLE, _check_epsilon, _check_log_file, _fail, _go_offline, _need_extra, _resume_conflicts, _parse_ladder, _policy, _prompt_records, _read_lines,
                    _read_runs, _unread)

app = typer.Typer(
    cls=Group,
    help="bia: batch-invariance studies of LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain "Error: ..." line for a mistyped option, not a box that wraps in logs
)

PolicyFile = Annotated[Optional[Path], typer.Option("--policy", help="A TOML or JSON file of V3 policy fields.")]
ModelPrefix = Annotated[Optional[str], typer.Option(help="S1: the blessed model's file-name prefix.")]
ModelLabel = Annotated[Optional[str], typer.Option(help="The model's name in the S1 reason.")]
Bands = Annotated[Optional[str], typer.Option(metavar="C,C,...", help="S2: the bands, comma separated, e.g. 1,4,8,16.")]
Epsilon = Annotated[Optional[float], typer.Option(help="S5: the near-tie epsilon (margin < epsilon).")]
Cap = Annotated[Optional[int], typer.Option(help="How many batched bands may pass by near-tie.")]
Floor = Annotated[Optional[int], typer.Option(help="The floor under declared_min.")]
S7Ratio = Annotated[Optional[float], typer.Option(help="S7: least decode-rate ratio of c=4 to c=1.")]
Offline = Annotated[bool, typer.Option("--offline", help="Read URL sources from the cache only; never the network.")]


@app.command("shape-check", cls=Command)
def shape_check_command(
    path: Annotated[str, typer.Argument(metavar="WITNESS", help="A witness file or http(s) URL.")],
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    model_label: ModelLabel = None,
    bands: Bands = None,
    epsilon: Epsilon = None,
    cap: Cap = None,
    floor: Floor = None,
    s7_ratio: S7Ratio = None,
    offline: Offline = False,
) -> None:
    """aprender's V3 serving-shape check. Exit 0 admissible, 5 not, 3 no such file, 4 unreadable, 6 a URL not fetched."""
    from ..io._sources import SourceError

    _go_offline(offline)
    policy = _policy(policy_file, model_prefix, model_label, bands, epsilon, cap, floor, s7_ratio)
    try:
        verdict = shape_check(path, policy=policy)
    except IsADirectoryError:
        typer.echo(f"RED: cannot read witness {path}: Is a directory", err=True)
        raise typer.Exit(EXIT_MISSING) from None
    except FileNotFoundError:
        typer.echo(f"RED: cannot read witness {path}: No such file or directory", err=True)
        raise typer.Exit(EXIT_MISSING) from None
    except SourceError as exc:
        typer.echo(f"RED: cannot read witness {path}: {exc}", err=True)
        raise typer.Exit(EXIT_UNREACHABLE) from None
    if verdict.status == "RED":
        typer.echo(verdict.reasons[0], err=True)
    for line in verdict.stdout_lines():
        typer.echo(line)
    raise typer.Exit(verdict.exit_code)


@app.command("witness", cls=Command)
def witness_command(
    paths: Annotated[list[str], typer.Argument(metavar="SOURCE...", help="Witness or marker files, folders, globs or URLs.")],
    reasons: Annotated[bool, typer.Option("--reasons", help="List every V3 reason and discrepancy.")] = False,
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    bands: Bands = None,
    offline: Offline = False,
) -> None:
    """A terminal table of witnesses and their bands, with the V3 verdict of each witness."""
    _go_offline(offline)
    from ..views import print_witness_tables
    from ..core._fields import WitnessError
    from ..io._sources import SourceError
    from ..witness import read_witnesses

    policy = _policy(policy_file, model_prefix, None, bands, None, None, None, None)
    from ..report._inputs import run_directory_problem

    for path in paths:  # a run directory, not read file by file as witnesses (its cache files are none)
        if (problem := run_directory_problem(path)) is not None:
            raise _fail(problem, EXIT_RED)
    try:
        ws = read_witnesses(paths)
    except (FileNotFoundError, IsADirectoryError, SourceError) as exc:
        raise _unread(exc) from None
    except WitnessError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_RED) from None
    print_witness_tables(ws, ws.shape_checks(policy), show_reasons=reasons)


MappingFile = Annotated[Optional[Path], typer.Option("--mapping", help="Dumps: a JSON or CSV file saying which file is which (source, prompt_id, "
                                                                        "role, band_c, slot, repeat).")]
BandPerFile = Annotated[bool, typer.Option("--band-per-file", help="Dumps: each file is one band of the requests it holds (c their count); "
                                                                   "a file of one request is an m=1 reference.")]


def _assemble(dumps: list[str], mapping: Path | None, band_per_file: bool, *, command: str = "report"):
    """The run the dumps make, or a one-line error and bia's exit code: 3 a path that does not exist (6 a URL not fetched), 4 a dump
    bia cannot read, 2 a request it cannot place."""
    from ..core._strictjson import NOT_JSON
    from ..dumps import DumpError
    from ..io._sources import SourceError
    from ..report._inputs import ACCEPTS
    from ..run import RunError, assemble_dumps

    try:
        return assemble_dumps(dumps, mapping=mapping, band_per_file=band_per_file)
    except (FileNotFoundError, SourceError) as exc:
        raise _unread(exc) from None
    except DumpError as exc:
        if exc.problem.startswith(NOT_JSON):  # a file broken off, not one of an unknown kind: said as bia witness says it
            raise _fail(exc, 4) from None
        where = f"{exc.record}.{exc.field}" if exc.field else exc.record
        if command == "assemble":
            raise _fail(f"{exc.source}: not a logprob dump bia reads ({where}: {exc.problem})", 4) from None
        raise _fail(f"{exc.source}: neither a witness (no witness_version), a release marker, a run directory nor a logprob dump bia reads "
                    f"({where}: {exc.problem}); {ACCEPTS}", 4) from None
    except RunError as exc:
        raise _fail(str(exc), 2) from None


@app.command("assemble", cls=Command)
def assemble_command(
    dumps: Annotated[Optional[list[str]], typer.Argument(metavar="DUMP...", help="Dump files, folders or globs (envelopes: prompt_id, role, band_c, slot).")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The run directory to write.")] = Path("runs/assembled"),
    mapping: MappingFile = None,
    band_per_file: BandPerFile = False,
    force: Annotated[bool, typer.Option("--force", help="Replace what the output folder holds.")] = False,
) -> None:
    """Write a run directory from loose dumps, each request placed by its capture envelope, --mapping or --band-per-file.

    Exit 0 written, 2 a request it cannot place (file and field named) or an occupied output, 3 no such path, 4 not a dump, 6 a URL not fetched.
    """
    from ..report._inputs import is_lone
    from ..run import RunError, write_run

    if not dumps and mapping is None:
        raise _fail("give the dumps (files, folders or globs), or --mapping FILE")
    run = _assemble(dumps or [], mapping, band_per_file, command="assemble")
    try:
        folder = write_run(run, output, force=force)
    except OutputExists as exc:
        raise _fail(exc) from None
    except RunError as exc:
        raise _fail(str(exc), 4) from None
    requests = run.dump.requests.unique(["source", "record"]).height
    typer.echo(f"wrote {folder}: {requests} request{'s' if requests != 1 else ''}, {len(run.prompts)} prompt(s), ladder {run.ladder}")
    if is_lone(run):
        typer.echo("note: one request allows no batch comparison (it is ref #1 of its prompt); add the prompt sent in batches of c", err=True)


@app.command("report", cls=Command)
def report_command(
    sources: Annotated[Optional[list[str]], typer.Argument(metavar="SOURCE...", help="Witness sources, run directories and dumps (files, folders, globs); "
                                                                "the embedded default if none.")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path("parity-report.html"),
    epsilon: Annotated[float, typer.Option(help="The near-tie epsilon for runs.")] = 0.05,
    reference: Annotated[str, typer.Option(metavar="REFERENCE", help="Compare batched requests with ref1, ref2, or another run directory's ref #1.")] = "ref1",
    title: Annotated[str, typer.Option(help="The report's title.")] = "Batch-parity report",
    notebook: Annotated[Optional[Path], typer.Option(help="Also keep the executed notebook here.")] = None,
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    bands: Bands = None,
    admission: Annotated[bool, typer.Option("--admission", help="Judge the runs by aprender's V3 release gate too (implied by "
                                                                "--policy, --model-prefix and --bands).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Overwrite the output (and --notebook) when they exist.")] = False,
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
    from ..core._output import claim_output
    from ..io._sources import same_sources
    from ..report._inputs import is_lone, sort_sources

    _check_epsilon(epsilon)
    policy = _policy(policy_file, model_prefix, None, bands, None, None, None, None)
    try:  # before the notebook runs for a minute: a report never lands on something it was not asked to replace
        claim_output(output, force=force, what="-o")
        if notebook is not None:
            claim_output(notebook, force=force, what="--notebook")
    except OutputExists as exc:
        raise _fail(exc) from None
    given, repeated = same_sources(sources or [])
    for first, again in repeated:
        typer.echo(f"note: {again} is {first} given again; it is read once", err=True)
    try:
        runs, witness_sources, dumps, skipped = sort_sources(given)
    except FileNotFoundError as exc:
        raise _fail(str(exc), EXIT_MISSING) from None
    for file, why in skipped:
        typer.echo(f"note: {file} is left out of the runs: {why}", err=True)
    if band_per_file and not dumps and mapping is None:
        raise _fail("--band-per-file places dumps, and no dump was given")
    assembled = _assemble(dumps, mapping, band_per_file) if dumps or mapping is not None else None
    if assembled is not None and is_lone(assembled):
        typer.echo("note: one request allows no batch comparison; the report says what it can and cannot judge", err=True)
    with tempfile.TemporaryDirectory(prefix="bia-report-") as scratch:
        if assembled is not None:
            from ..run import write_run

            name = f"{Path(dumps[0]).name if len(dumps) == 1 and mapping is None else 'dumps'} (assembled)"
            labelled = dataclasses.replace(assembled, manifest={**assembled.manifest, "label": name})  # the scratch folder goes
            runs.append(str(write_run(labelled, Path(scratch) / name)))
        _report(runs, witness_sources, output=output, epsilon=epsilon, reference=reference, title=title, notebook=notebook, policy=policy,
                policy_file=policy_file, model_prefix=model_prefix, bands=bands, admission=admission)


def _report(runs: list[str], witness_sources: list[str], *, output: Path, epsilon: float, reference: str, title: str, notebook: Path | None,
            policy: V3Policy, policy_file: Path | None, model_prefix: str | None, bands: str | None, admission: bool) -> None:
    """Read the runs and witnesses, so that a bad file is named here, then render the report."""
    import dataclasses

    from ..core._fields import WitnessError
    from ..io._sources import SourceError
    from ..witness import read_witnesses
    from ..report import ReportError, default_runs, default_sources, render_report
    from ..report._inputs import ACCEPTS

    try:  # read here first, so a bad file is named directly rather than from inside a kernel
        from ..run import RunError, read_run

        for run in runs or ([] if witness_sources else default_runs()):
            read_run(run)
        read_witnesses(witness_sources or ([] if runs else default_sources()), progress=sys.stderr.isatty())
    except (FileNotFoundError, IsADirectoryError, SourceError) as exc:
        raise _unread(exc) from None
    except (WitnessError, RunError, ValueError) as exc:
        hint = f"; {ACCEPTS}" if isinstance(exc, WitnessError) and "neither a witness" in str(exc) else ""
        typer.echo(f"error: {exc}{hint}", err=True)
        raise typer.Exit(EXIT_RED) from None
    overrides = {k: v for k, v in dataclasses.asdict(policy).items() if v != getattr(V3Policy(), k)}
    try:
        asked = admission or policy_file is not None or model_prefix is not None or bands is not None  # then the runs meet aprender's gate too
        written = render_report(witness_sources, output, runs=runs, epsilon=epsilon, reference=reference, title=title, policy=overrides,
                                admission=asked, executed_notebook=notebook, force=True)  # claimed above
    except ReportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {written}")


def _row_invariant_blas(modes: list[str]) -> None:
    """For the row-invariant mode, MKL's AVX2 branch unless one is chosen: set before torch loads (MKL reads it once),
    it makes runs repeat bit for bit and keeps the row-count-independent GEMM the mode rests on (rowwise.check_blas)."""
    if "row-invariant" in modes:
        os.environ.setdefault("MKL_CBWR", "AVX2")


@app.command("experiment", cls=Command)
def experiment_command(
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the runs (one per kernel mode).")] = Path("runs/experiment"),
    prompts: Annotated[Optional[Path], typer.Option(help="A text file of prompts, one per line.")] = None,
    ladder: Annotated[str, typer.Option(metavar="C,C,...", help="Batch sizes, comma separated.")] = "1,4,8,16",
    modes: Annotated[str, typer.Option(metavar="MODE,MODE,...", help="Kernel modes, comma separated: default, one-by-one, fixed-tiles, "
                                            "row-invariant (batch-invariant: one-by-one's old name).")] = "default,one-by-one,fixed-tiles",
    layout: Annotated[str, typer.Option(metavar="LAYOUT", help="copies (c copies of one prompt) or needle (the prompt among others).")] = "copies",
    dtype: Annotated[str, typer.Option(metavar="DTYPE", help="float32 or bfloat16.")] = "float32",
    device: Annotated[str, typer.Option(metavar="DEVICE", help="cpu, or cuda when torch sees a GPU.")] = "cpu",
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 64,
    top_k: Annotated[int, typer.Option(help="Candidates recorded per step.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed for the needle positions.")] = 0,
    model: Annotated[Optional[Path], typer.Option(help="Model weights (safetensors + .json); the bundled tiny model by default.")] = None,
    trainer: Annotated[bool, typer.Option("--trainer", help="Also recompute every sampled sequence as an RL trainer does (one forward "
                                                             "pass per sequence, in the run's kernel mode) and write the sampler-trainer "
                                                             "pairs to OUTPUT/trainer/<mode>.jsonl (a prime-rl token export).")] = False,
    trainer_batch: Annotated[int, typer.Option(help="Sequences per trainer forward pass.")] = 8,
    recompute: Annotated[Optional[list[Path]], typer.Option(metavar="RUN", help="With --trainer: recompute this experiment run "
                                                                "instead of decoding new ones (OUTPUT/trainer/<run folder>.jsonl). Repeatable.")] = None,
    hf: Annotated[Optional[Path], typer.Option("--hf", metavar="CHECKPOINT", help="Instead of bia's kernel modes, probe transformers' own "
                                                "batched generate on this causal LM checkpoint folder (or bia's own model file, data/tiny-model/tiny_lm.safetensors): left-padded (OUTPUT/padded) "
                                                "and continuous batching where the release has it (OUTPUT/continuous).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace runs already in the output folder.")] = False,
) -> None:
    """Decode a real transformer at several batch sizes in each kernel mode and write bia runs."""
    _need_extra("torch", "torch", "experiment")
    if hf is not None:
        _need_extra("transformers", "hf", "experiment --hf")
        from ._hf import hf_command

        return hf_command(hf, output, prompts, ladder, layout, max_tokens, top_k, dtype, device, force)
    from ..experiment import DEFAULT_PROMPTS, ExperimentError, run_experiment
    from ..experiment.trainer import write_trainer_pairs
    from ..run import RunError

    if recompute and not trainer:
        raise _fail(ExperimentError("--recompute: give --trainer too (it recomputes runs as a trainer does)"))
    if trainer_batch < 1:  # said before any decoding, not after it
        raise _fail(ExperimentError(f"--trainer-batch: expected an integer >= 1, got {trainer_batch}"))
    _read_runs(recompute or [], "--recompute")
    _row_invariant_blas(modes.split(","))

    texts = DEFAULT_PROMPTS if prompts is None else _read_lines(prompts, "--prompts")
    try:
        folders = list(recompute) if recompute else run_experiment(
            output, prompts=texts, ladder=_parse_ladder(ladder), modes=modes.split(","), layout=layout, dtype=dtype, device=device,
            max_tokens=max_tokens, top_k=top_k, seed=seed, model_path=model, progress=sys.stderr.isatty(), force=force)
        for folder in folders if not recompute else []:
            typer.echo(f"wrote {folder}")
        for folder in folders if trainer else []:
            pairs = write_trainer_pairs(folder, output / "trainer" / f"{Path(folder).name}.jsonl", batch_size=trainer_batch,
                                        model_path=model, force=force)
            typer.echo(f"wrote {pairs}")
    except (ExperimentError, OutputExists, RunError, ValueError) as exc:
        raise _fail(exc) from None


@app.command("probe", cls=Command)
def probe_command(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(metavar="URL", help="The server's base URL or its /v1/chat/completions endpoint.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The run directory to write.")] = Path("runs/probe"),
    prompts: Annotated[Optional[Path], typer.Option(help="A text file of prompts, one per line; or a .jsonl file of "
                                                             '{"text": ..., "answer": ...} lines, for accuracy and Std@Acc.')] = None,
    ladder: Annotated[str, typer.Option(metavar="C,C,...", help="Batch sizes, comma separated.")] = "1,4,8,16",
    repeats: Annotated[int, typer.Option(help="How many times each band is fired, interleaved across c.")] = 1,
    max_tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 64,
    top_logprobs: Annotated[int, typer.Option(help="Candidates per step.")] = 5,
    seed: Annotated[int, typer.Option(help="The request's seed, and the needle positions'.")] = 0,
    layout: Annotated[str, typer.Option(metavar="LAYOUT", help="copies (c copies of the prompt) or needle (the prompt among c-1 fillers).")] = "copies",
    fillers: Annotated[Optional[Path], typer.Option(help="Needle layout: a text file of filler prompts, one per line.")] = None,
    arms: Annotated[Optional[str], typer.Option(metavar="ARM,ARM,...", help="Control arms to fire for each prompt instead of --layout: "
                                                "repeat, copies, mixed, prefix, cache, serial, prefill (analysis.attribution_table puts each "
                                                "divergence on the first that reproduces it).")] = None,
    observer: Annotated[bool, typer.Option(help="Also fire each band without logprobs and compare the texts.")] = False,
    engine: Annotated[str, typer.Option(metavar="ENGINE", help="auto, or one of: vllm, sglang, llamacpp, apr, bia, openai.")] = "auto",
    model: Annotated[Optional[str], typer.Option(help="The model name to send (the server's first model by default).")] = None,
    server_log: Annotated[Optional[Path], typer.Option(help="The server's log, for the batch width of every step.")] = None,
    log_pattern: Annotated[str, typer.Option(metavar="REGEX", help="Regex whose group 1 is a batch width.")] = r"Batch m=(\d+) done",
    metrics: Annotated[bool, typer.Option(help="Sample the running-requests gauge, and read the prefix-cache metrics, on /metrics around each band.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds each whole request may take, its stream included.")] = 120.0,
    declared_min: Annotated[Optional[int], typer.Option(help="Tokens the two references must agree on (min(64, max_tokens) by default).")] = None,
    expect: Annotated[Optional[list[str]], typer.Option(metavar="KEY=VALUE", help="A setting the server should report (kernel_mode=fixed-tiles); "
                                                              "checked and shown as requested against effective. Repeatable.")] = None,
    bands_anyway: Annotated[bool, typer.Option(help="Run the bands even for a prompt whose two m=1 references part before "
                                                    "--declared-min (aprender's probe runs none).")] = False,
    api_key: Annotated[Optional[str], typer.Option(metavar="KEY", envvar="BIA_API_KEY", show_envvar=True,
                                                   help="Bearer token for servers that need one (vllm --api-key, hosted APIs); never written "
                                                        "into the run.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Say the engine, the first request's body and the plan; fire nothing, write nothing.")] = False,
    resume: Annotated[bool, typer.Option(help="Finish the interrupted run in --output with its own settings.")] = False,
    retry_refused: Annotated[bool, typer.Option(help="With --resume, also fire again the bands that had a request refused.")] = False,
) -> None:
    """Fire the same greedy request alone and in batches of c at a live server, and write a run."""
    import asyncio
    import json

    from ..experiment import DEFAULT_PROMPTS
    from ..probe import ProbeError, ServerGone, ServerUnreachable, probe
    from ..probe._rundir import NoRunToResume, RunUnreadable

    texts = DEFAULT_PROMPTS if prompts is None else _prompt_records(prompts) if prompts.suffix == ".jsonl" else _read_lines(prompts, "--prompts")
    if resume:  # a resumed run keeps its own settings: the same ones given again are fine, one that differs is named
        kept = ("url", "output", "resume", "retry_refused", "timeout", "server_log", "metrics", "api_key")  # what may differ after a restart
        # by name: typer may carry its own copy of click's ParameterSource
        given = [name for name in ctx.params if name not in kept and getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]
        values = {**ctx.params, "ladder": _parse_ladder(ladder), "prompts": texts, "fillers": _read_lines(fillers, "--fillers") if fillers else [],
                  "arms": [a.strip() for a in arms.split(",")] if arms is not None else None}
        differ = _resume_conflicts(output, given, values)
        if differ:
            typer.echo(f"error: {'; '.join(differ)}: a resumed run keeps the settings in {output / 'manifest.json'} (drop the option, or "
                       "write a new run with another -o)", err=True)
            raise typer.Exit(2)
    filler_texts = _read_lines(fillers, "--fillers") if fillers else None
    try:
        re.compile(log_pattern)
    except re.error as exc:
        raise _fail(f"--log-pattern {log_pattern!r}: not a regular expression ({exc})") from None
    if server_log is not None and not server_log.is_file():
        raise _fail(f"--server-log {server_log}: no such file (start the server with its log there first)")
    expected = {}
    for item in expect or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            typer.echo(f"error: --expect takes KEY=VALUE, got {item!r}", err=True)
            raise typer.Exit(2)
        try:
            expected[key] = json.loads(value)  # true, 1, "x" as JSON; anything else as text
        except ValueError:
            expected[key] = value
    # what a dry run and a probe are both given
    shared = {"prompts": texts, "ladder": _parse_ladder(ladder), "repeats": repeats, "max_tokens": max_tokens,
              "top_logprobs": top_logprobs, "seed": seed, "layout": layout, "observer": observer, "engine": engine, "model": model,
              "api_key": api_key, "timeout": timeout, "arms": [a.strip() for a in arms.split(",")] if arms is not None else None}
    try:
        if dry_run:
            from ..probe import dry_run as describe

            planned = asyncio.run(describe(url, **shared))
            typer.echo(planned["said"])
            typer.echo(f"effective settings the server reports: {json.dumps(planned['effective'])}")
            typer.echo(f"first request body: {json.dumps(planned['body'])}")
            typer.echo(f"plan: {len(planned['units'])} steps, {planned['requests']} completions: {', '.join(planned['units'])}")
            typer.echo("dry run: nothing fired, nothing written")
            return
        folder = asyncio.run(probe(url, output, **shared, fillers=filler_texts, server_log=server_log, log_pattern=log_pattern,
                                   metrics=metrics, declared_min=declared_min, expect=expected, bands_anyway=bands_anyway, resume=resume,
                                   retry_refused=retry_refused))
    except (ServerUnreachable, ServerGone) as exc:  # nothing answers, before the run or in the middle of it: exit 6 either way
        raise _fail(exc, EXIT_UNREACHABLE) from None
    except (NoRunToResume, RunUnreadable) as exc:  # --resume: no run there (3), or one bia cannot read (4)
        raise _fail(exc, EXIT_MISSING if isinstance(exc, NoRunToResume) else EXIT_RED) from None
    except OutputExists as exc:  # a file where the run's folder should be, or a folder that refuses writing: before any request
        raise _fail(exc) from None
    except (ProbeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {output} stays readable (bia report lists what it lacks); finish it with bia probe {url} -o {output} --resume",
                   err=True)
        raise typer.Exit(130) from None
    from ..probe._summary import result_line

    typer.echo(f"wrote {folder}")
    typer.echo(result_line(folder))  # what the run found, in one line: the report says the rest


@app.command("serve", cls=Command)
def serve_command(
    host: Annotated[str, typer.Option(metavar="ADDRESS", help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on.")] = 8000,
    mode: Annotated[str, typer.Option(metavar="MODE", help="Kernel mode: default, one-by-one, fixed-tiles or "
                                           "row-invariant (batch-invariant: one-by-one's old name).")] = "default",
    dtype: Annotated[str, typer.Option(metavar="DTYPE", help="float32 or bfloat16.")] = "float32",
    device: Annotated[str, typer.Option(metavar="DEVICE", help="cpu, or cuda when torch sees a GPU.")] = "cpu",
    model: Annotated[Optional[Path], typer.Option(help="Model weights; the bundled tiny model by default.")] = None,
    log_file: Annotated[Optional[Path], typer.Option(help="Append the per-step batch log here (what bia probe --server-log reads).")] = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="Also print every decode step's batch line on the terminal.")] = False,
) -> None:
    """Serve the experiment's model as an OpenAI-compatible chat endpoint with continuous batching.

    The terminal gets a line per request (and the start-up line); every decode step's batch line goes to --log-file, and
    to the terminal only with -v."""
    import logging

    _need_extra("torch", "torch", "serve")
    _row_invariant_blas([mode])

    from ..experiment import ExperimentError, bundled_model
    from ..core._modes import mode_as_asked
    from ..experiment.modes import KERNEL_MODES, MODE_ALIASES, kernel_mode

    if mode not in KERNEL_MODES and mode not in MODE_ALIASES:
        raise _fail(f"--mode takes one of {', '.join(KERNEL_MODES)} (batch-invariant is one-by-one's old name), got {mode!r}")
    if dtype not in ("float32", "bfloat16"):
        raise _fail(f"--dtype takes float32 or bfloat16, got {dtype!r}")
    weights = model or bundled_model()
    if not weights.exists():
        raise _fail(f"--model {weights}: no such file or folder")
    if weights.is_dir() and kernel_mode(mode) in ("fixed-tiles", "row-invariant"):
        raise _fail(f"--mode {kernel_mode(mode)} runs bia's own model's layers, not a Hugging Face model's ({weights})")
    if log_file is not None:
        _check_log_file(log_file)
    import torch

    from ..experiment import check_device
    from ..experiment.model import load_model
    from ..serve import create_app, serve

    try:
        check_device(device)
        loaded = load_model(weights, getattr(torch, dtype), device)
    except ExperimentError as exc:
        raise _fail(str(exc)) from None
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise _fail(f"--model {weights}: cannot load it: {exc}") from None
    terminal = logging.StreamHandler()
    if not verbose:  # a step a line is thousands of lines for a few probes: the log file keeps them
        terminal.addFilter(lambda record: record.name != "bia.serve" or record.levelno > logging.INFO)
    handlers: list[logging.Handler] = [terminal]
    if log_file is not None:
        try:
            handlers.append(logging.FileHandler(log_file))
        except OSError as exc:  # checked above; this is what changed since
            raise _fail(f"--log-file {log_file}: cannot be written: {exc.strerror or exc}") from None
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=handlers)
    if not serve(create_app(loaded, mode, Path(weights).stem), host, port,
                 said=f"kernel mode {mode_as_asked(mode, kernel_mode(mode))}, {dtype} on {device}, model {Path(weights).stem}"):
        raise _fail(f"--host {host} --port {port}: cannot listen there (the port in use, or an address not of this machine)")


app.command("certify", cls=Command)(certify_command)  # defined in its own module: this one is near the 600-line limit


@app.command("history", cls=Command)
def history_command(
    sources: Annotated[list[str], typer.Argument(metavar="SOURCE...", help="Run directories, witness and marker files or URLs, folders of them.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The history folder to add them to (made when missing).")],
    offline: Offline = False,
) -> None:
    """Add runs, witnesses and markers to a history folder (each once), for bia trend."""
    from ..core._fields import WitnessError
    from ..studies._history import HistoryError, append_history
    from ..io._sources import SourceError
    from ..run import RunError

    from ..core._output import OutputUnwritable, check_writable

    _go_offline(offline)
    try:
        check_writable(output / "history.json", "the history folder")  # before any source is read
        before = _history_size(output)
        history = append_history(sources, output)
    except (FileNotFoundError, SourceError) as exc:
        raise _unread(exc) from None
    except (WitnessError, RunError, HistoryError) as exc:
        raise _fail(str(exc), 4) from None
    except OutputExists as exc:
        raise _fail(exc.problem if isinstance(exc, OutputUnwritable) else f"{exc.problem}; a history folder holds history.json") from None
    typer.echo(f"{output}: {history.entries.height - before} new entr{'y' if history.entries.height - before == 1 else 'ies'}, "
               f"{history.entries.height} in all")


def _history_size(folder: Path) -> int:
    from ..studies._history import read_history

    return read_history([folder]).entries.height if (folder / "history.json").is_file() else 0


@app.command("trend", cls=Command)
def trend_command(
    sources: Annotated[Optional[list[str]], typer.Argument(metavar="SOURCE...", help="History folders, runs, witnesses, markers; the embedded history if none.")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path("trend.html"),
    title: Annotated[str, typer.Option(help="The report's title.")] = "Batch-invariance trend",
    force: Annotated[bool, typer.Option("--force", help="Overwrite the output when it exists.")] = False,
    offline: Offline = False,
) -> None:
    """The trend report: bands over time per host, engine and model, regressions flagged with the commits around them."""
    from ..core._fields import WitnessError
    from ..studies._history import HistoryError
    from ..io._sources import SourceError
    from ..report import ReportError
    from ..run import RunError
    from ..report.trend import render_trend

    _go_offline(offline)
    try:
        written = render_trend(sources or [], output, title=title, force=force)
    except OutputExists as exc:
        raise _fail(exc) from None
    except (FileNotFoundError, SourceError) as exc:
        raise _unread(exc) from None
    except (WitnessError, RunError, HistoryError) as exc:
        raise _fail(str(exc), 4) from None
    except ReportError as exc:
        raise _fail(str(exc), 1) from None
    typer.echo(f"wrote {written}")


def main() -> None:
    """Entry point of the ``bia`` console script and ``python -m analysis``."""
    app(prog_name="bia")
