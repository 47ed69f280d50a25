"""The ``bia`` command line: ``shape-check``, ``witness`` and ``report``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from ._v3 import EXIT_MISSING, EXIT_RED, PolicyError, V3Policy, shape_check

app = typer.Typer(
    help="bia: batch-invariance studies of LLM inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

PolicyFile = Annotated[Optional[Path], typer.Option("--policy", help="A TOML or JSON file of V3 policy fields.")]
ModelPrefix = Annotated[Optional[str], typer.Option(help="S1: the blessed model's file-name prefix.")]
ModelLabel = Annotated[Optional[str], typer.Option(help="The model's name in the S1 reason.")]
Bands = Annotated[Optional[str], typer.Option(help="S2: the bands, comma separated, e.g. 1,4,8,16.")]
Epsilon = Annotated[Optional[float], typer.Option(help="S5: the near-tie epsilon (margin < epsilon).")]
Cap = Annotated[Optional[int], typer.Option(help="How many batched bands may pass by near-tie.")]
Floor = Annotated[Optional[int], typer.Option(help="The floor under declared_min.")]
S7Ratio = Annotated[Optional[float], typer.Option(help="S7: least decode-rate ratio of c=4 to c=1.")]


def _policy(policy_file, model_prefix, model_label, bands, epsilon, cap, floor, s7_ratio) -> V3Policy:
    overrides = {
        "model_prefix": model_prefix,
        "model_label": model_label,
        "bands": _parse_bands(bands) if bands is not None else None,
        "near_tie_epsilon": epsilon,
        "near_tie_cap": cap,
        "declared_min_floor": floor,
        "s7_ratio": s7_ratio,
    }
    try:
        if policy_file is not None:
            return V3Policy.from_file(policy_file, **overrides)
        return V3Policy.from_mapping({k: v for k, v in overrides.items() if v is not None}, source="options")
    except (PolicyError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _parse_bands(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        typer.echo(f"error: --bands takes comma-separated integers, got {text!r}", err=True)
        raise typer.Exit(2) from None


@app.command("shape-check")
def shape_check_command(
    path: Annotated[str, typer.Argument(help="A witness file or http(s) URL.")],
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    model_label: ModelLabel = None,
    bands: Bands = None,
    epsilon: Epsilon = None,
    cap: Cap = None,
    floor: Floor = None,
    s7_ratio: S7Ratio = None,
) -> None:
    """aprender's V3 serving-shape check. Exit 0 admissible, 5 not, 3 no such file, 4 unreadable."""
    from ._sources import SourceError

    policy = _policy(policy_file, model_prefix, model_label, bands, epsilon, cap, floor, s7_ratio)
    try:
        verdict = shape_check(path, policy=policy)
    except IsADirectoryError:
        typer.echo(f"RED: cannot read witness {path}: Is a directory", err=True)
        raise typer.Exit(EXIT_MISSING) from None
    except (FileNotFoundError, SourceError) as exc:
        why = "No such file or directory" if isinstance(exc, FileNotFoundError) else str(exc)
        typer.echo(f"RED: cannot read witness {path}: {why}", err=True)
        raise typer.Exit(EXIT_MISSING) from None
    if verdict.status == "RED":
        typer.echo(verdict.reasons[0], err=True)
    for line in verdict.stdout_lines():
        typer.echo(line)
    raise typer.Exit(verdict.exit_code)


@app.command("witness")
def witness_command(
    paths: Annotated[list[str], typer.Argument(help="Witness or marker files, folders, globs or URLs.")],
    reasons: Annotated[bool, typer.Option("--reasons", help="List every V3 reason and discrepancy.")] = False,
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    bands: Bands = None,
) -> None:
    """A terminal table of witnesses and their bands, with the V3 verdict of each witness."""
    from ._display import print_witness_tables
    from ._fields import WitnessError
    from ._sources import SourceError
    from ._witness import read_witnesses

    policy = _policy(policy_file, model_prefix, None, bands, None, None, None, None)
    try:
        ws = read_witnesses(paths)
    except (FileNotFoundError, IsADirectoryError, SourceError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_MISSING) from None
    except WitnessError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_RED) from None
    print_witness_tables(ws, ws.shape_checks(policy), show_reasons=reasons)


@app.command("report")
def report_command(
    sources: Annotated[Optional[list[str]], typer.Argument(help="Witness sources and run directories; the embedded default if none.")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path("parity-report.html"),
    epsilon: Annotated[float, typer.Option(help="The near-tie epsilon for runs.")] = 0.05,
    reference: Annotated[str, typer.Option(help="Compare batched requests with ref1, ref2, or another run directory's ref #1.")] = "ref1",
    title: Annotated[str, typer.Option(help="The report's title.")] = "Batch-parity report",
    notebook: Annotated[Optional[Path], typer.Option(help="Also keep the executed notebook here.")] = None,
    policy_file: PolicyFile = None,
    model_prefix: ModelPrefix = None,
    bands: Bands = None,
) -> None:
    """Execute the parity report notebook (papermill) and export one offline HTML file."""
    import dataclasses

    from ._fields import WitnessError
    from ._sources import SourceError
    from ._witness import read_witnesses
    from .report import ReportError, default_runs, default_sources, render_report

    policy = _policy(policy_file, model_prefix, None, bands, None, None, None, None)
    runs = [s for s in sources or [] if (Path(s) / "manifest.json").exists()]
    witness_sources = [s for s in sources or [] if s not in runs]
    try:  # read here first, so a bad file is named directly rather than from inside a kernel
        from .run import RunError, read_run

        for run in runs or ([] if witness_sources else default_runs()):
            read_run(run)
        read_witnesses(witness_sources or ([] if runs else default_sources()), progress=sys.stderr.isatty())
    except (FileNotFoundError, IsADirectoryError, SourceError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_MISSING) from None
    except (WitnessError, RunError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_RED) from None
    overrides = {k: v for k, v in dataclasses.asdict(policy).items() if v != getattr(V3Policy(), k)}
    try:
        written = render_report(witness_sources, output, runs=runs, epsilon=epsilon, reference=reference, title=title, policy=overrides,
                                executed_notebook=notebook)
    except ReportError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"wrote {written}")


@app.command("experiment")
def experiment_command(
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for the runs (one per kernel mode).")] = Path("runs/experiment"),
    prompts: Annotated[Optional[Path], typer.Option(help="A text file of prompts, one per line.")] = None,
    ladder: Annotated[str, typer.Option(help="Batch sizes, comma separated.")] = "1,4,8,16",
    modes: Annotated[str, typer.Option(help="Kernel modes, comma separated: default, batch-invariant.")] = "default,batch-invariant",
    layout: Annotated[str, typer.Option(help="copies (c copies of one prompt) or needle (the prompt among others).")] = "copies",
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    device: Annotated[str, typer.Option(help="cpu, or cuda when torch sees a GPU.")] = "cpu",
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 64,
    top_k: Annotated[int, typer.Option(help="Candidates recorded per step.")] = 20,
    seed: Annotated[int, typer.Option(help="Seed for the needle positions.")] = 0,
    model: Annotated[Optional[Path], typer.Option(help="Model weights (safetensors + .json); the bundled tiny model by default.")] = None,
) -> None:
    """Decode a real transformer at several batch sizes in both kernel modes and write bia runs."""
    from .experiment import DEFAULT_PROMPTS, run_experiment

    texts = DEFAULT_PROMPTS if prompts is None else [line for line in prompts.read_text(encoding="utf-8").splitlines() if line.strip()]
    try:
        folders = run_experiment(output, prompts=texts, ladder=[int(c) for c in ladder.split(",")], modes=modes.split(","), layout=layout,
                                 dtype=dtype, device=device, max_tokens=max_tokens, top_k=top_k, seed=seed, model_path=model,
                                 progress=sys.stderr.isatty())
    except (ValueError, KeyError, FileNotFoundError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    for folder in folders:
        typer.echo(f"wrote {folder}")


@app.command("probe")
def probe_command(
    ctx: typer.Context,
    url: Annotated[str, typer.Argument(help="The server's base URL or its /v1/chat/completions endpoint.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The run directory to write.")] = Path("runs/probe"),
    prompts: Annotated[Optional[Path], typer.Option(help="A text file of prompts, one per line; or a .jsonl file of "
                                                             '{"text": ..., "answer": ...} lines, for accuracy and Std@Acc.')] = None,
    ladder: Annotated[str, typer.Option(help="Batch sizes, comma separated.")] = "1,4,8,16",
    repeats: Annotated[int, typer.Option(help="How many times each band is fired, interleaved across c.")] = 1,
    max_tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 64,
    top_logprobs: Annotated[int, typer.Option(help="Candidates per step.")] = 5,
    seed: Annotated[int, typer.Option(help="The request's seed, and the needle positions'.")] = 0,
    layout: Annotated[str, typer.Option(help="copies (c copies of the prompt) or needle (the prompt among c-1 fillers).")] = "copies",
    fillers: Annotated[Optional[Path], typer.Option(help="Needle layout: a text file of filler prompts, one per line.")] = None,
    observer: Annotated[bool, typer.Option(help="Also fire each band without logprobs and compare the texts.")] = False,
    engine: Annotated[str, typer.Option(help="auto, or one of: vllm, sglang, llamacpp, apr, bia, openai.")] = "auto",
    model: Annotated[Optional[str], typer.Option(help="The model name to send (the server's first model by default).")] = None,
    server_log: Annotated[Optional[Path], typer.Option(help="The server's log, for the batch width of every step.")] = None,
    log_pattern: Annotated[str, typer.Option(help="Regex whose group 1 is a batch width.")] = r"Batch m=(\d+) done",
    metrics: Annotated[bool, typer.Option(help="Sample the running-requests gauge, and read the prefix-cache metrics, on /metrics around each band.")] = True,
    timeout: Annotated[float, typer.Option(help="Seconds each whole request may take, its stream included.")] = 120.0,
    declared_min: Annotated[Optional[int], typer.Option(help="Tokens the two references must agree on (min(64, max_tokens) by default).")] = None,
    expect: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE a setting the server should report (kernel_mode=batch-invariant); "
                                                              "checked and shown as requested against effective. Repeatable.")] = None,
    bands_anyway: Annotated[bool, typer.Option(help="Run the bands even for a prompt whose two m=1 references part before "
                                                    "--declared-min (aprender's probe runs none).")] = False,
    api_key: Annotated[Optional[str], typer.Option(envvar="BIA_API_KEY", show_envvar=True,
                                                   help="Bearer token for servers that need one (vllm --api-key, hosted APIs); never written "
                                                        "into the run.")] = None,
    dry_run: Annotated[bool, typer.Option(help="Say the engine, the first request's body and the plan; fire nothing, write nothing.")] = False,
    resume: Annotated[bool, typer.Option(help="Finish the interrupted run in --output with its own settings.")] = False,
    retry_refused: Annotated[bool, typer.Option(help="With --resume, also fire again the bands that had a request refused.")] = False,
) -> None:
    """Fire the same greedy request alone and in batches of c at a live server, and write a run."""
    import asyncio
    import json

    from .experiment import DEFAULT_PROMPTS
    from .probe import ProbeError, probe

    def lines(path: Path) -> list[str]:
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    if resume:  # a resumed run keeps its own settings: say so rather than ignore what was given
        kept = ("url", "output", "resume", "retry_refused", "timeout", "server_log", "metrics", "api_key")  # what may differ after a restart
        # by name: typer may carry its own copy of click's ParameterSource
        given = [name for name in ctx.params if name not in kept and getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"]
        if given:
            options = ", ".join("--" + name.replace("_", "-") for name in given)
            typer.echo(f"error: {options} cannot change when a run is resumed; it keeps the settings in {output / 'manifest.json'}", err=True)
            raise typer.Exit(2)
    texts = DEFAULT_PROMPTS if prompts is None else _prompt_records(prompts) if prompts.suffix == ".jsonl" else lines(prompts)
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
    try:
        widths = [int(c) for c in ladder.split(",")]
    except ValueError:
        typer.echo(f"error: --ladder takes whole numbers separated by commas, got {ladder!r}", err=True)
        raise typer.Exit(2) from None
    # what a dry run and a probe are both given
    shared = {"prompts": texts, "ladder": widths, "repeats": repeats, "max_tokens": max_tokens,
              "top_logprobs": top_logprobs, "seed": seed, "layout": layout, "observer": observer, "engine": engine, "model": model,
              "api_key": api_key, "timeout": timeout}
    try:
        if dry_run:
            from .probe import dry_run as describe

            planned = asyncio.run(describe(url, **shared))
            typer.echo(planned["said"])
            typer.echo(f"effective settings the server reports: {json.dumps(planned['effective'])}")
            typer.echo(f"first request body: {json.dumps(planned['body'])}")
            typer.echo(f"plan: {len(planned['units'])} steps, {planned['requests']} completions: {', '.join(planned['units'])}")
            typer.echo("dry run: nothing fired, nothing written")
            return
        folder = asyncio.run(probe(url, output, **shared, fillers=lines(fillers) if fillers else None, server_log=server_log, log_pattern=log_pattern,
                                   metrics=metrics, declared_min=declared_min, expect=expected, bands_anyway=bands_anyway, resume=resume,
                                   retry_refused=retry_refused))
    except (ProbeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted: {output} stays readable (bia report lists what it lacks); finish it with bia probe {url} -o {output} --resume",
                   err=True)
        raise typer.Exit(130) from None
    typer.echo(f"wrote {folder}")


def _prompt_records(path: Path) -> list[dict]:
    """A JSON-lines prompt set: each line an object with a non-empty "text" and an optional "answer"."""
    import json

    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            typer.echo(f"error: {path}: line {number}: not JSON ({exc})", err=True)
            raise typer.Exit(2) from None
        if not isinstance(record, dict) or not isinstance(record.get("text"), str) or not record["text"]:
            typer.echo(f'error: {path}: line {number}: field "text": expected a non-empty string in an object', err=True)
            raise typer.Exit(2)
        records.append(record)
    return records


@app.command("serve")
def serve_command(
    host: Annotated[str, typer.Option(help="Address to listen on (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    mode: Annotated[str, typer.Option(help="Kernel mode: default or batch-invariant.")] = "default",
    dtype: Annotated[str, typer.Option(help="float32 or bfloat16.")] = "float32",
    device: Annotated[str, typer.Option(help="cpu, or cuda when torch sees a GPU.")] = "cpu",
    model: Annotated[Optional[Path], typer.Option(help="Model weights; the bundled tiny model by default.")] = None,
    log_file: Annotated[Optional[Path], typer.Option(help="Also append the per-step batch log here.")] = None,
) -> None:
    """Serve the experiment's model as an OpenAI-compatible chat endpoint with continuous batching."""
    import logging

    import torch
    import uvicorn

    from .experiment import bundled_model
    from .experiment.model import load_model
    from .serve import create_app

    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if log_file is not None:
        handlers.append(logging.FileHandler(log_file))
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=handlers)
    if dtype not in ("float32", "bfloat16"):
        typer.echo(f"error: dtype must be float32 or bfloat16, got {dtype!r}", err=True)
        raise typer.Exit(2)
    weights = model or bundled_model()
    app_ = create_app(load_model(weights, getattr(torch, dtype), device), mode, Path(weights).stem)
    uvicorn.run(app_, host=host, port=port, log_level="warning")


def main() -> None:
    """Entry point of the ``bia`` console script and ``python -m analysis``."""
    app(prog_name="bia")
