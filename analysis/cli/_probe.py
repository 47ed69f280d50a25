"""``bia probe``: the same greedy request fired alone and in batches of c at a live server, written as a run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from ..core import OutputExists
from ..verdicts import EXIT_MISSING, EXIT_RED
from ._args import EXIT_UNREACHABLE, _fail, _parse_ladder, _prompt_records, _read_lines, _resume_conflicts


def probe_command(
    ctx: typer.Context,
    url: Annotated[
        str, typer.Argument(metavar="URL", help="The server's base URL or its /v1/chat/completions endpoint.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="The run directory to write.")] = Path("runs/probe"),
    prompts: Annotated[
        Path | None,
        typer.Option(
            help="A text file of prompts, one per line; or a .jsonl file of "
            '{"text": ..., "answer": ...} lines, for accuracy and Std@Acc.'
        ),
    ] = None,
    ladder: Annotated[str, typer.Option(metavar="C,C,...", help="Batch sizes, comma separated.")] = "1,4,8,16",
    repeats: Annotated[int, typer.Option(help="How many times each band is fired, interleaved across c.")] = 1,
    max_tokens: Annotated[int, typer.Option(help="Tokens per request.")] = 64,
    top_logprobs: Annotated[int, typer.Option(help="Candidates per step.")] = 5,
    seed: Annotated[int, typer.Option(help="The request's seed, and the needle positions'.")] = 0,
    layout: Annotated[
        str,
        typer.Option(
            metavar="LAYOUT",
            help="copies (c copies of the prompt), needle (the prompt among c-1 fillers) or rotating (c-1 copies and a "
            "filler whose row and text change with every repeat: each repeat a new batch context).",
        ),
    ] = "copies",
    fillers: Annotated[
        Path | None, typer.Option(help="Needle and rotating layouts: a text file of filler prompts, one per line.")
    ] = None,
    arms: Annotated[
        str | None,
        typer.Option(
            metavar="ARM,ARM,...",
            help="Control arms to fire for each prompt instead of --layout: "
            "repeat, copies, mixed, prefix, cache, serial, prefill (analysis.attribution_table puts each "
            "divergence on the first that reproduces it).",
        ),
    ] = None,
    observer: Annotated[bool, typer.Option(help="Also fire each band without logprobs and compare the texts.")] = False,
    engine: Annotated[
        str, typer.Option(metavar="ENGINE", help="auto, or one of: vllm, sglang, llamacpp, apr, bia, openai.")
    ] = "auto",
    model: Annotated[
        str | None, typer.Option(help="The model name to send (the server's first model by default).")
    ] = None,
    server_log: Annotated[
        Path | None, typer.Option(help="The server's log, for the batch width of every step.")
    ] = None,
    log_pattern: Annotated[
        str, typer.Option(metavar="REGEX", help="Regex whose group 1 is a batch width.")
    ] = r"Batch m=(\d+) done",
    metrics: Annotated[
        bool,
        typer.Option(
            help="Sample the running-requests gauge, and read the prefix-cache metrics, on /metrics around each band."
        ),
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds each whole request may take, its stream included.")] = 120.0,
    refire: Annotated[
        int,
        typer.Option(
            min=0,
            metavar="N",
            help="Fire a band again, up to N times (within 60 s), when its widths show a batch narrower than its c; "
            "the last attempt is kept and the manifest lists them all.",
        ),
    ] = 2,
    declared_min: Annotated[
        int | None, typer.Option(help="Tokens the two references must agree on (min(64, max_tokens) by default).")
    ] = None,
    expect: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="A setting the server should report (kernel_mode=fixed-tiles); "
            "checked and shown as requested against effective. Repeatable.",
        ),
    ] = None,
    bands_anyway: Annotated[
        bool,
        typer.Option(
            help="Run the bands even for a prompt whose two m=1 references part before "
            "--declared-min (aprender's probe runs none)."
        ),
    ] = False,
    api_key: Annotated[
        str | None,
        typer.Option(
            metavar="KEY",
            envvar="BIA_API_KEY",
            show_envvar=True,
            help="Bearer token for servers that need one (vllm --api-key, hosted APIs); never written into the run.",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Say the engine, the first request's body and the plan; fire nothing, write nothing.")
    ] = False,
    resume: Annotated[bool, typer.Option(help="Finish the interrupted run in --output with its own settings.")] = False,
    retry_refused: Annotated[
        bool, typer.Option(help="With --resume, also fire again the bands that had a request refused.")
    ] = False,
) -> None:
    """Fire the same greedy request alone and in batches of c at a live server, and write a run."""
    import asyncio
    import json

    from ..experiment import DEFAULT_PROMPTS
    from ..probe import NoRunToResume, ProbeError, ProbeSettings, RunUnreadable, ServerGone, ServerUnreachable, probe
    from ..probe import dry_run as describe

    texts = (
        DEFAULT_PROMPTS
        if prompts is None
        else _prompt_records(prompts)
        if prompts.suffix == ".jsonl"
        else _read_lines(prompts, "--prompts")
    )
    if resume:  # a resumed run keeps its own settings: the same ones given again are fine, one that differs is named
        kept = (
            "url",
            "output",
            "resume",
            "retry_refused",
            "timeout",
            "refire",
            "server_log",
            "metrics",
            "api_key",
        )  # what may differ after a restart
        # by name: typer may carry its own copy of click's ParameterSource
        given = [
            name
            for name in ctx.params
            if name not in kept and getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE"
        ]
        values = {
            **ctx.params,
            "ladder": _parse_ladder(ladder),
            "prompts": texts,
            "fillers": _read_lines(fillers, "--fillers") if fillers else [],
            "arms": [a.strip() for a in arms.split(",")] if arms is not None else None,
        }
        differ = _resume_conflicts(output, given, values)
        if differ:
            typer.echo(
                f"error: {'; '.join(differ)}: a resumed run keeps the settings in {output / 'manifest.json'} (drop the option, or "
                "write a new run with another -o)",
                err=True,
            )
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
    steps = _parse_ladder(ladder)
    try:  # one settings object, for the dry run and the probe alike; a setting no run can be made of is refused as it is made
        settings = ProbeSettings(
            prompts=texts,
            ladder=steps,
            repeats=repeats,
            max_tokens=max_tokens,
            top_logprobs=top_logprobs,
            seed=seed,
            layout=layout,
            fillers=filler_texts or (),
            arms=[a.strip() for a in arms.split(",")] if arms is not None else None,
            observer=observer,
            engine=engine,
            model=model,
            server_log=server_log,
            log_pattern=log_pattern,
            metrics=metrics,
            timeout=timeout,
            refire=refire,
            declared_min=declared_min,
            expect=expected,
            bands_anyway=bands_anyway,
            api_key=api_key,
            resume=resume,
            retry_refused=retry_refused,
        )
        if dry_run:
            planned = asyncio.run(describe(url, settings))
            typer.echo(planned["said"])
            typer.echo(f"effective settings the server reports: {json.dumps(planned['effective'])}")
            typer.echo(f"first request body: {json.dumps(planned['body'])}")
            typer.echo(
                f"plan: {len(planned['units'])} steps, {planned['requests']} completions: {', '.join(planned['units'])}"
            )
            typer.echo("dry run: nothing fired, nothing written")
            return
        folder = asyncio.run(probe(url, output, settings))
    except (
        ServerUnreachable,
        ServerGone,
    ) as exc:  # nothing answers, before the run or in the middle of it: exit 6 either way
        raise _fail(exc, EXIT_UNREACHABLE) from None
    except (NoRunToResume, RunUnreadable) as exc:  # --resume: no run there (3), or one bia cannot read (4)
        raise _fail(exc, EXIT_MISSING if isinstance(exc, NoRunToResume) else EXIT_RED) from None
    except (
        OutputExists
    ) as exc:  # a file where the run's folder should be, or a folder that refuses writing: before any request
        raise _fail(exc) from None
    except (ProbeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo(
            f"interrupted: {output} stays readable (bia report lists what it lacks); finish it with bia probe {url} -o {output} --resume",
            err=True,
        )
        raise typer.Exit(130) from None
    from ..probe import result_line

    typer.echo(f"wrote {folder}")
    typer.echo(result_line(folder))  # what the run found, in one line: the report says the rest
