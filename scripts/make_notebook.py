"""Write the notebooks (notebooks/parity_report.ipynb, notebooks/trend_report.ipynb, the templates bia report and
bia trend execute, and the tutorials notebooks/01_witnesses.ipynb, 02_dumps_and_runs.ipynb, 03_probe.ipynb,
04_trend.ipynb, 05_report.ipynb) from the cell sources below (run after editing them).

Keeping the notebook's source here makes its diffs readable; the .ipynb is committed
unexecuted, with no outputs.
"""

import textwrap
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook


def _src(text: str) -> str:
    """A cell's source written as an indented triple-quoted block."""
    return textwrap.dedent(text).strip("\n")


CELLS = [
    ("markdown", "*bia parity report.* Run it with `bia report` or papermill: verdicts first, then the figures, the detail, aprender's V3 gate and the provenance."),
    (
        "parameters",
        '# bia parity report: run it with `bia report` or papermill. The verdict cards come first, then the figures, then the detail.\n'
        '# Witness and marker sources: files, folders, glob patterns or http(s) URLs.\n'
        '# With no sources and no runs, the embedded default: real perf041 witnesses from host "lambda", the CPU torch experiment and a llama.cpp server.\n'
        "sources: list = []\n"
        "# Run directories (manifest.json + captures/), as bia's probe and experiment write them.\n"
        "runs: list = []\n"
        "# The near-tie epsilon for the runs' margins (a margin explains a divergence iff 0 <= margin < epsilon).\n"
        "epsilon: float = 0.05\n"
        '# What batched requests are compared with: "ref1", "ref2" (the run\'s m=1 references), or another run directory.\n'
        'reference: str = "ref1"\n'
        "# The report's title.\n"
        'title: str = "Batch-parity report"\n'
        '# Overrides of aprender\'s V3 policy constants, e.g. {"model_prefix": "llama-3.1-8b"}; empty is aprender\'s.\n'
        "policy: dict = {}\n"
        "# Also judge every run by aprender's V3 release gate (always so when policy is given; witnesses are always judged).\n"
        "admission: bool = False",
    ),
    (
        "code",
        "import warnings\n\n"
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import HTML, display\n\n"
        "import analysis\n"
        "from analysis import report\n"
        "from analysis.run import CapturesCutShort, read_run\nfrom analysis.studies import open_runs\n\n"
        "# bia report said each capture cut short on stderr; the page lists them with what each run lacks\n"
        'warnings.simplefilter("ignore", CapturesCutShort)\n'
        "v3_policy = analysis.V3Policy.from_mapping(policy)\n"
        "judge_runs = admission or bool(policy)\n"
        "default = not sources and not runs\n"
        "witness_sources = sources or ([] if runs else analysis.default_sources())\n"
        "run_paths = runs or ([] if sources else report.default_runs())\n"
        "ws = analysis.read_witnesses(witness_sources, progress=False)\n"
        "run_objects = open_runs(run_paths)  # run directories and studies, their tables computed a piece at a time\n"
        'against = reference if reference in ("ref1", "ref2") else read_run(reference)\n'
        "display(HTML(report.header_html(title, ws, run_objects, default=default, admission=bool(ws.sources) or judge_runs)))\n"
        "# One judgement (analysis.judge): the answer table, the cards and the sections below all render its rows.\n"
        "judgement = report.judge_report(ws, run_objects)\n"
        "display(HTML(report.answer_section_html(judgement)))\n"
        "display(HTML(report.reviews_html(ws, run_objects, epsilon=epsilon, reference=against, judgement=judgement)))\n"
        "if len(run_objects) > 1:\n"
        '    display(HTML("<h2>Runs side by side</h2><p>Per run and batch size: the share of requests whose float32 logprobs are bit-identical to '
        "the reference, token flips, the run's verdict and its largest ULP distance from m=1, the median per-request decode rate, its ratio "
        "to the c=1 baseline (the answer's) and that rate over the default mode's in the same folder: the parity a kernel mode buys and what it costs.</p>\"))\n"
        "    display(HTML(report.mode_comparison_html(run_objects, reference=against, judgement=judgement)))\n"
        "engines = report.engines_html(run_objects, judgement=judgement)\n"
        "if engines:\n"
        '    display(HTML("<h2>Engines side by side</h2><p>One model served by several engines: where each engine\'s streams part from '
        "the reference engine's m=1 stream of the same prompt, and each run's verdict against its own m=1 (the answer above).</p>\"))\n"
        "    display(HTML(engines))",
    ),
    (
        "code",
        "# The sampler-trainer pairs bia experiment --trainer writes beside the runs (and, in the embedded default, a real vLLM\n"
        "# sampler's rollouts recomputed by transformers): every RL framework's mismatch metrics.\n"
        "pairs = report.trainer_pairs(run_paths) + (report.default_rl_pairs() if default else [])\n"
        "if pairs:\n"
        "    display(HTML(report.rl_mismatch_html(pairs)))\n"
        '    display(HTML(report.figures_html(report.rl_mismatch_figures(pairs), "Sampler-trainer mismatch figures")))',
    ),
    (
        "code",
        'display(HTML("<h2>Figures</h2><p>Each run\'s and the witnesses\' figures, collapsed: open one to see where its requests part, '
        'the margins there, the widths formed and the decode rates.</p>"))\n'
        "if ws.sources:\n"
        '    display(HTML(report.figures_html(report.witness_figures(ws), "Witnesses: divergence and decode rate against c, and the env knobs '
        'that differ")))\n'
        "for run in run_objects:\n"
        '    display(HTML(report.figures_html(report.run_figures(run, epsilon=epsilon, reference=against), f"Run {run.label}")))',
    ),
    (
        "code",
        'display(HTML("<h2>Detail</h2><p>Each run\'s provenance, negative control, forks and per-prompt tables, and each witness set\'s '
        'bands and markers; long tables show their worst rows and count the rest.</p>"))\n'
        "for run in run_objects:\n"
        "    display(HTML(report.run_details_html(run, epsilon=epsilon, reference=against)))\n"
        "if ws.sources:\n"
        "    display(HTML(report.witness_details_html(ws)))",
    ),
    (
        "code",
        "if ws.sources or judge_runs:\n"
        "    display(HTML(report.admission_html(ws, ws.shape_checks(v3_policy), run_objects if judge_runs else [], v3_policy, judgement)))\n"
        "# a run is named by its label: a run bia report assembled from dumps, by what was given, not its scratch folder\n"
        'parameters = {"sources": witness_sources, "runs": [run.label for run in run_objects], "epsilon": epsilon,\n'
        '              "reference": reference, "policy": policy, "admission": judge_runs}\n'
        "display(HTML(report.provenance_html(parameters, ws, v3_policy, run_objects, default=default)))",
    ),
]


WALKTHROUGH = [
    ("markdown", _src("""
        # 3. Probe a server across batch sizes

        The same greedy request alone and in batches of c, every token with its logprobs,
        candidates and arrival time, the batch widths the server really formed, and what parted from the m=1 reference.
        With no `url`, this notebook starts `bia serve` (the repository's tiny model on CPU) inside its own kernel.

        You will learn to:

        - probe a server with `analysis.probe.probe` and open the run it writes with `read_run`;
        - read the band table, with the share of requests bit-identical and token-identical to m=1 added from the
          request table, and the run's verdict and its reason from `analysis.judge`, as `bia certify` gives them;
        - plot the batch widths formed, the divergences and the decode rates.

        Give `url` (and `server_log`) to probe your own server; papermill takes the same parameters
        (`-p url http://gpu-box:8000 -y 'ladder: [1, 4, 8, 16]'`). About 10 seconds with the defaults.""")),
    (
        "parameters",
        "# An OpenAI-compatible server (vLLM, SGLang, llama.cpp, apr serve, ...); empty starts bia serve in this kernel.\n"
        'url: str = ""\n'
        '# bia serve\'s kernel mode when url is empty: "default", "one-by-one", "fixed-tiles" or "row-invariant".\n'
        'mode: str = "default"\n'
        "# The server's log, for the batch width of every decode step (bia serve started here writes one next to the run).\n"
        'server_log: str = ""\n'
        "# The prompts, the batch sizes, and the tokens per request.\n"
        'prompts: list = ["If the argument is"]\n'
        "ladder: list = [1, 4, 8]\n"
        "max_tokens: int = 24\n"
        "# Fire each band again without logprobs and compare the texts (the observer effect).\n"
        "observer: bool = False\n"
        "# The run directory to write; empty picks a new one under runs/.\n"
        'output: str = ""',
    ),
    (
        "code",
        "import time\n"
        "from pathlib import Path\n\n"
        "import matplotlib.pyplot as plt\n"
        "import polars as pl\n"
        "from IPython.display import HTML, display\n\n"
        "import analysis\n"
        "from analysis import plots, report\n"
        "from analysis.probe import probe\n"
        "from analysis.run import band_table, observer_table, read_run, slot_table, width_table\n\n"
        'output = output or f"runs/walkthrough-{time.strftime(\'%Y%m%d-%H%M%S\')}"\n'
        "server = None\n"
        "if not url:  # bia serve in this kernel, logging each decode step's batch width\n"
        "    from analysis.serve import BackgroundServer\n\n"
        "    Path(output).parent.mkdir(parents=True, exist_ok=True)\n"
        '    server_log = server_log or f"{output}.serve.log"\n'
        "    server = BackgroundServer(mode, log_file=server_log)\n"
        "    url = server.url\n"
        "try:\n"
        "    run_dir = await probe(url, output, prompts=prompts, ladder=ladder, max_tokens=max_tokens, server_log=server_log or None,\n"
        "                          observer=observer, progress=False, say=print)\n"
        "finally:\n"
        "    if server is not None:\n"
        "        server.stop()\n"
        "run = read_run(run_dir)\n"
        'print(f"wrote {run_dir}: {run.dump.requests.height} requests; missing: {len(run.missing())}")',
    ),
    ("markdown", _src("""
        Per request: the first divergence, the bitwise-equal float32 prefix (`bitwise_prefix`: a request is
        bit-identical to m=1 when it covers its whole `length`) and the largest ULP distance before it, the reference's
        margin where the streams parted, and the request's own decode rate.""")),
    ("code", "slots = slot_table(run)\n"
             'slots.select("prompt_id", "c", "slot", "length", "divergence_at", "bitwise_prefix", "max_ulp",\n'
             '             "reference_margin", "k3_max", "decode_tok_s")'),
    ("markdown", _src("""
        Per band: the widths the server formed, the share of its requests bit-identical and token-identical to the m=1
        reference (from the request table above), how far the slots agree with it, and the median decode rate.""")),
    ("code", _src("""
        identical = slots.group_by("prompt_id", "c", "repeat").agg(
            bit_identical_share=(pl.col("bitwise_prefix") == pl.col("length")).mean(),
            token_identical_share=(~pl.col("diverged")).mean())
        bands = band_table(run).join(identical, on=["prompt_id", "c", "repeat"], how="left")
        bands.select("prompt_id", "c", "repeat", "widths_seen", "bit_identical_share", "token_identical_share", "divergence_min",
                     "diverged_slots", "decode_tok_s", "s_per_1000_seq")""")),
    ("code", _src("""
        per_c = slots.group_by("c").agg(
            requests=pl.len(), bits=(pl.col("bitwise_prefix") == pl.col("length")).sum(), tokens=(~pl.col("diverged")).sum()
        ).sort("c")
        # the verdict is analysis.judge's, as bia certify and assert_batch_invariant give it: all requests bit-identical is
        # AMBER, not GREEN, until enough distinct batch contexts bound the divergence rate below 1%
        server_name = f"bia serve --mode {mode}" if server is not None else url
        for verdict in analysis.judge(run):
            cause = f" ({verdict['cause']})" if verdict["cause"] else ""
            print(f"Verdict for {server_name} ({verdict['arm']}): {verdict['verdict']}{cause}: {verdict['reason']}")
            print(f"  next: {verdict['next_step']}")
        print("Per c, against the m=1 reference:")
        for row in per_c.iter_rows(named=True):
            print(f"  c={row['c']}: {row['bits']} of {row['requests']} bit-identical, {row['tokens']} token-identical")""")),
    ("markdown", _src("""
        The same verdict as the parity report's card for this run (`analysis.report.reviews_html`). With the default
        kernel mode, torch sums a batch's rows together, so expect logprobs that differ in their last bits from c = 4 on;
        run the notebook again with `-p mode fixed-tiles` to see a server none of whose requests part: AMBER, since 12
        batched requests are too few to bound the divergence rate below 1% (GREEN takes 299 distinct batch contexts).""")),
    ("code", "display(HTML(report.reviews_html(analysis.read_witnesses([], progress=False), [run], epsilon=0.05)))"),
    (
        "code",
        "fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))\n"
        "plots.plot_band_widths(width_table(run), ax=axes[0])\n"
        "plots.plot_divergence(slots, declared_min=run.declared_min, ax=axes[1])\n"
        "plots.plot_decode_rate(bands, ax=axes[2])\n"
        "fig.tight_layout()\n"
        "plt.show()",
    ),
    ("code", "if observer:\n    display(observer_table(run))"),
    ("markdown", "The whole parity report of this run, as one offline HTML file: `bia report RUN_DIR -o report.html` (see `05_report.ipynb`)."),
]

TREND = [
    ("markdown", "*bia trend report.* Run it with `bia trend` or papermill: a history of runs, witnesses and release markers over time."),
    (
        "parameters",
        "# History folders, run directories, witness and marker files or URLs; empty: the embedded history.\n"
        "history: list = []\n"
        "# The report's title.\n"
        'title: str = "Batch-invariance trend"',
    ),
    (
        "code",
        "import warnings\n\n"
        "import matplotlib.pyplot as plt\n"
        "from IPython.display import HTML, display\n\n"
        "import analysis\n"
        "from analysis import report, trend\n"
        "from analysis.run import CapturesCutShort\n\n"
        "# bia trend said each capture cut short on stderr, before the notebook ran\n"
        'warnings.simplefilter("ignore", CapturesCutShort)\n'
        "sources = history or trend.default_history_sources()\n"
        "past = analysis.read_history(sources)\n"
        "display(HTML(trend.header_html(title, history=past, sources=history)))\n"
        "display(HTML(trend.regressions_html(past)))",
    ),
    (
        "code",
        "for key in trend.series_keys(past):\n"
        "    display(HTML(trend.series_heading_html(key)))\n"
        "    for metric, label, words in trend.METRICS:\n"
        "        fig, ax = plt.subplots(figsize=(8, 3.2))\n"
        "        trend.plot_trend(past, key, metric, ax=ax)\n"
        "        if ax.get_lines() and any(line.get_label().startswith('c=') for line in ax.get_lines()):\n"
        "            report.show_figure(fig, trend.figure_alt(key, metric))\n"
        "        else:\n"
        "            plt.close(fig)",
    ),
    ("code", "display(HTML(trend.entries_html(past)))"),
]

# --- tutorials: each runs top to bottom on the embedded data (tests/test_tutorials.py) ---------------

WITNESSES = [
    ("markdown", _src("""
        # 1. Parity witnesses: what aprender's probe recorded, and what it means

        aprender's perf041 probe sends the same greedy request alone (m=1) and in batches of c, and writes a *witness*:
        per batch size c, where the batched streams first part from the m=1 reference, and a PASS/FAIL result.
        This notebook reads the three real witnesses embedded in `data/aprender-lambda/` (`apr serve` on an RTX 4090).

        You will learn to:

        - read witnesses into polars frames with `analysis.read_witnesses` and find your way in its five frames;
        - see why the same measurement is FAIL in one file and PASS in another (each file's own witness version);
        - run aprender's V3 serving-shape check (`shape_checks`, `shape_check`, `V3Policy`) and read its reasons;
        - plot the divergence against c, and see what a witness cannot tell you (margins, decode rates).

        Run it in JupyterLab (`make lab`) or with papermill, from the repository root or from `notebooks/`.""")),
    ("code", _src("""
        from pathlib import Path

        import matplotlib.pyplot as plt
        import polars as pl

        import analysis

        LAMBDA = Path(analysis.default_sources()[0])  # data/aprender-lambda, found wherever this notebook runs
        ws = analysis.read_witnesses(LAMBDA, progress=False)
        ws""")),
    ("markdown", _src("""
        `read_witnesses` takes files, folders, glob patterns or URLs and returns a `WitnessSet` of five frames:
        `witnesses` (one row per file), `bands` (one per c), `slots` (one per request of a band), `markers`
        (release markers) and `discrepancies` (recorded values that disagree with their version's rules).
        Every row carries its `source`; below, `short` keeps only the file name so the tables stay narrow.""")),
    ("code", _src("""
        def short(frame: pl.DataFrame) -> pl.DataFrame:
            \"\"\"The frame with each source shown as its file name.\"\"\"
            return frame.with_columns(pl.col("source").map_elements(lambda s: Path(s).name, return_dtype=pl.String))


        short(ws.witnesses).select("source", "witness_version", "model_path", "declared_min", "env_BATCHED_PREFILL",
                                   "reference_self_divergence_at", "recorded_verdict", "derived_verdict")""")),
    ("markdown", _src("""
        Per band: `divergence_at` is the first token where the batched streams part from the m=1 reference,
        `result` what the file recorded and `derived_result` what bia re-derives with the rules of the file's own
        `witness_version` (version 1 passes a band only if `divergence_at >= declared_min`; version 2 gates on the
        batch formed, refused and frozen slots and the agreement inside the batch, not on agreement with m=1).""")),
    ("code", _src("""
        short(ws.bands).select("source", "witness_version", "c", "m_formed", "divergence_at", "declared_min", "result",
                               "derived_result", "result_agrees")""")),
    ("code", _src("""
        batched = ws.bands.filter(pl.col("c") > 1)
        parts = batched["divergence_at"].unique().sort().to_list()
        print(f"Finding: in all {ws.witnesses.height} witness files, every band with c > 1 parts from m=1 at token "
              f"{', '.join(map(str, parts))} (declared_min is {batched['declared_min'].max()}).")
        for (version,), group in batched.sort("witness_version").group_by(["witness_version"], maintain_order=True):
            files = group["source"].n_unique()
            print(f"  witness_version {version} ({files} file{'s' if files > 1 else ''}): those bands are "
                  f"{'/'.join(group['derived_result'].unique().sort())} under that version's rules.")
        alone = ws.bands.filter(pl.col("c") == 1).join(ws.witnesses.select("source", "reference_self_divergence_at"), on="source")
        for row in short(alone).sort("source").iter_rows(named=True):
            print(f"  c=1 (a request alone) in {row['source']}: parts at token {row['divergence_at']}; "
                  f"its two m=1 references agree up to token {row['reference_self_divergence_at']}")
        print(f"Recorded and re-derived results agree in {ws.bands['result_agrees'].sum()} of {ws.bands.height} bands; "
              f"{ws.discrepancies.height} discrepancies.")""")),
    ("markdown", _src("""
        So the *same measurement*, batched streams parting from m=1 at token 3, is FAIL in the version-1 files and
        PASS in the version-2 file: a reader must apply each file's own rules rather than mix them. Even a request
        alone is not a fixed point here: where the two m=1 references part at token 100, so does the c=1 band. bia records
        whether each recorded value agrees with the rules of its version; `ws.discrepancies` would list any that do not.

        The `slots` frame shows every request of a band: `agree_to` (aprender's word) is how far it agrees with m=1, and (version 2)
        `intra_agree_to` how far the requests of one batch agree with each other.""")),
    ("code", _src("""
        per_band = (ws.slots.filter(pl.col("c") > 1)
                    .group_by("source", "witness_version", "c", maintain_order=True)
                    .agg(requests=pl.len(), agree_to_min=pl.col("agree_to").min(), agree_to_max=pl.col("agree_to").max(),
                         intra_agree_to_min=pl.col("intra_agree_to").min()))
        short(per_band)""")),
    ("code", _src("""
        v2 = per_band.filter(pl.col("witness_version") == 2)
        print(f"Finding: in the version-2 witness every batched request agrees with m=1 up to token "
              f"{v2['agree_to_max'].max()} only, yet the requests of each batch agree with each other up to token "
              f"{v2['intra_agree_to_min'].min()}: the batched path is consistent with itself and differs from the single-request path.")""")),
    ("markdown", _src("""
        ## aprender's V3 serving-shape check

        `ws.shape_checks()` judges every witness with aprender's V3 release gate (`apr test llm shape-check`): the
        blessed model, the bands, the declared minimum, divergences not explained by a near-tie, and the S7 decode-rate
        ratio. Each verdict prints as aprender's CLI does.""")),
    ("code", _src("""
        verdicts = ws.shape_checks()
        for verdict in verdicts.values():
            print(verdict, end="\\n\\n")""")),
    ("code", _src("""
        statuses = sorted({v.status for v in verdicts.values()})
        first = next(iter(verdicts.values()))
        shared = [reason for reason in first.reasons if all(reason in v.reasons for v in verdicts.values())]
        print(f"Finding: V3 says {' / '.join(statuses)} for {len(verdicts)} of {len(verdicts)} witnesses; "
              f"the reasons all of them share:")
        for reason in shared:
            print(f"  - {reason}")""")),
    ("markdown", _src("""
        The policy's constants are data (`analysis.V3Policy`). Bless this witness's model and the divergences remain:
        the gate would excuse an early divergence only where the reference's top-1/top-2 margin was below the
        near-tie epsilon, and a perf041 witness records no margin at all.""")),
    ("code", _src("""
        policy = analysis.V3Policy.from_mapping({"model_prefix": "qwen2.5-coder-1.5b", "model_label": "Qwen2.5-Coder-1.5B"})
        v2_file = LAMBDA / "witness@464c168e62.json"
        verdict = analysis.shape_check(v2_file, policy=policy)
        print(verdict)
        margins = ws.bands["top2_margin_at_divergence"].drop_nulls().len()
        print(f"\\nFinding: with the model blessed, {v2_file.name} is still {verdict.status} (exit code {verdict.exit_code}); "
              f"{margins} of {ws.bands.height} bands record a margin at their divergence, so no divergence can be excused as a near-tie.")
        verdict.to_frame()""")),
    ("markdown", _src("""
        ## Figures

        `plot_divergence` draws each witness's `divergence_at` against c with `declared_min` marked, `plot_decode_rate`
        the per-request decode rate (these witnesses record none, so the panel says so rather than drawing an
        empty box), and `plot_env_knobs` the kernel environment knobs that differ between the files.""")),
    ("code", _src("""
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
        analysis.plot_divergence(ws.bands, ax=axes[0])
        analysis.plot_decode_rate(ws.bands, ax=axes[1])
        fig.tight_layout()
        plt.show()

        fig, ax = plt.subplots(figsize=(8, 2.5))
        analysis.plot_env_knobs(ws.witnesses, ax=ax)
        plt.show()""")),
    ("markdown", _src("""
        A witness keeps tokens only: it can say *where* the streams parted, not how close the model's call was there
        (the margin) or how far the float32 logprobs drifted before. Runs with per-token logprob dumps answer that:
        see `02_dumps_and_runs.ipynb`.""")),
]

DUMPS_AND_RUNS = [
    ("markdown", _src("""
        # 2. Logprob dumps and run directories: bits, tokens and kernel modes

        A *run directory* is what bia's probe or its torch experiment writes: a `manifest.json` and raw captures of
        every request, each token with its float32 logprob and top-k candidates. This notebook reads the embedded runs:
        the CPU torch experiment in its four kernel modes (`data/experiment-cpu/`) and a real llama.cpp server with and
        without its prompt cache (`data/llamacpp-cpu/`).

        You will learn to:

        - open a run with `analysis.read_run` and its captures with `analysis.read_dumps`;
        - compare every batched request with the m=1 reference: `slot_table`, `band_table`, `drift_table`;
        - plot where requests parted, the reference margins and the logprob drift;
        - compare kernel modes with `analysis.mode_comparison` and say which one is batch invariant, and at what cost.""")),
    ("code", _src("""
        from pathlib import Path

        import matplotlib.pyplot as plt
        import polars as pl

        import analysis

        RUNS = {Path(path).name: Path(path) for path in analysis.default_runs()}  # the embedded runs, found wherever this notebook runs
        sorted(RUNS)""")),
    ("code", _src("""
        run = analysis.read_run(RUNS["default"])
        manifest = run.manifest
        print(f"engine {manifest['identity']['engine']}, kernel mode {manifest['effective']['kernel_mode']}, "
              f"{manifest['effective']['dtype']} on {manifest['effective']['device']}; ladder {run.ladder}; "
              f"{manifest['sampler']['max_tokens']} tokens per request, top-{manifest['sampler']['top_logprobs']}")
        print("determinism:", manifest["determinism"]["what"], "->", manifest["determinism"]["identical"])
        run""")),
    ("markdown", _src("""
        A `Run` holds the three frames of its dump: `requests` (one row per request, with its `role`: two m=1
        `reference`s per prompt, then the `band` requests, by `c` and `slot`), `tokens` (one per scored
        position) and `candidates` (the top-k alternatives at each position).""")),
    ("code", _src("""
        run.requests.group_by("role", "c").agg(requests=pl.len(), tokens=pl.col("completion_tokens").sum()).sort("role", "c")""")),
    ("code", _src("""
        run.tokens.select("record", "position", "token_text", "logprob", "value_status", "n_candidates", "t_arrival").head(5)""")),
    ("markdown", _src("""
        The captures are ordinary dumps: `analysis.read_dumps` reads them (or any vLLM, SGLang, llama.cpp, TGI or
        OpenAI capture) into the same frames, detecting the format per file. Sentinels never reach `logprob`;
        `value_status` says what each value was.""")),
    ("code", _src("""
        dump = analysis.read_dumps(RUNS["default"] / "captures", progress=False)
        print({Path(source).name: formats for source, formats in dump.formats.items()})
        print(f"{dump.tokens.height} tokens, the same as the run's: {dump.tokens.height == run.tokens.height}")
        dump.tokens.group_by("value_status").len()""")),
    ("markdown", _src("""
        ## Each batched request against the m=1 reference

        `slot_table` compares every request of every band with ref #1 of its prompt: `divergence_at` (the first
        differing token, or null when it never parts), `bitwise_prefix` (how many leading float32 logprobs
        are bit-identical), `max_ulp` and `max_abs_delta` (the largest drift before any divergence), and the
        reference's top-1/top-2 margin where it parted.""")),
    ("code", _src("""
        slots = analysis.slot_table(run)
        slots.select("prompt_id", "c", "slot", "length", "divergence_at", "bitwise_prefix", "max_ulp",
                     "max_abs_delta").head(6)""")),
    ("markdown", "A small helper says, per c, how many requests are token-identical and bit-identical to m=1; it is used for every run below."),
    ("code", _src("""
        def parity_by_c(slots: pl.DataFrame) -> pl.DataFrame:
            \"\"\"Per batch size c: requests token-identical and bit-identical (every float32 logprob) to the m=1 reference.\"\"\"
            differs = pl.col("bitwise_prefix") < pl.col("length")
            return (slots.group_by("c").agg(
                requests=pl.len(), token_identical=(~pl.col("diverged")).sum(), bit_identical=(~differs).sum(),
                first_token_flip=pl.col("divergence_at").min(), first_bit_difference=pl.col("bitwise_prefix").filter(differs).min(),
                max_ulp=pl.col("max_ulp").max(), max_abs_delta=pl.col("max_abs_delta").max()).sort("c"))


        def say(name: str, slots: pl.DataFrame) -> None:
            \"\"\"One line per c: the parity found.\"\"\"
            for row in parity_by_c(slots).iter_rows(named=True):
                bits = ("bit-identical" if row["bit_identical"] == row["requests"] else
                        f"{row['bit_identical']} bit-identical; logprobs first differ at token {row['first_bit_difference']}, "
                        f"by up to {row['max_ulp']} ULP ({row['max_abs_delta']:.1e})")
                print(f"  {name} c={row['c']}: {row['token_identical']} of {row['requests']} token-identical, {bits}")


        parity_by_c(slots)""")),
    ("code", _src("""
        print("Finding (torch, default kernel mode):")
        say("default", slots)""")),
    ("markdown", _src("""
        In the default mode torch runs the whole batch through each matmul, so a row's sums depend on how many rows
        share them: from c = 4 on the float32 logprobs part from m=1 (positions are 0-based, so token 1 is the second),
        while no token flips. `band_table` sums each band up (widths formed, divergences, intra-batch agreement,
        unique completions, decode rate), and `drift_table` gives |delta logprob| per step before any fork.""")),
    ("code", _src("""
        analysis.band_table(run).select("prompt_id", "c", "m_formed", "divergence_min", "diverged_slots", "intra_agree_to",
                                        "unique_completions", "decode_tok_s")""")),
    ("code", _src("""
        drift = analysis.drift_table(run)
        # drift_table names c inside its label ("p0 c=4 slot 2"); plot_delta_before_fork draws one line per c given a c column
        drift = drift.with_columns(c=pl.col("label").str.extract(r"c=(\\d+) slot \\d+$", 1).cast(pl.Int64))
        margins = analysis.reference_margins(run)  # per prompt: ref #1's top-1 minus top-2 logprob at every step
        parted = {prompt: group["divergence_at"].drop_nulls().to_list() for (prompt,), group in slots.group_by(["prompt_id"])}

        fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
        analysis.plot_divergence(slots, declared_min=run.declared_min, ax=axes[0])
        analysis.plot_margin_trace(margins, parted, ax=axes[1])
        analysis.plot_delta_before_fork(drift, ax=axes[2])
        fig.tight_layout()
        plt.show()""")),
    ("code", _src("""
        smallest = min(m for trace in margins.values() for m in trace if m is not None)
        print(f"Finding: the smallest top-1/top-2 margin along the references is {smallest:.3f}, the largest drift before any fork "
              f"{drift['abs_delta'].max():.1e}: the drift is far too small to flip a token, so no token flips.")""")),
    ("markdown", _src("""
        ## A real server: llama.cpp on CPU

        The same tables apply to any run, here two `bia probe` runs against `llama-server` (`-np 16`) serving the same
        tiny model as GGUF, once with `--no-cache-prompt` and once with its prompt cache (llama.cpp's default).""")),
    ("code", _src("""
        print("Finding (llama.cpp):")
        for name in ("no-cache-prompt", "cache-prompt"):
            say(name, analysis.slot_table(analysis.read_run(RUNS[name])))""")),
    ("markdown", _src("""
        Without the prompt cache a request alone repeats its reference bit for bit, while every request at c >= 4
        differs from its first token on, by the same maximum at every c: the batched path differs from the
        single-request one, not one batch size from another. With the cache on, even a request alone differs: each
        repeat reuses the cached prompt but its last token, evaluated alone, at another shape.

        ## Kernel modes: which one is batch invariant, and what it costs

        `analysis.mode_comparison` puts runs side by side: per run and c, the share of requests bit-identical to m=1,
        token flips, the largest ULP distance, the median decode rate and that rate over the `default` mode's.""")),
    ("code", _src("""
        modes = [analysis.read_run(RUNS[name]) for name in ("default", "batch-invariant", "fixed-tiles")]  # batch-invariant/ holds the one-by-one mode
        table = analysis.mode_comparison(modes)
        table.select("kernel_mode", "c", "requests", "bit_identical_share", "token_flips", "max_ulp", "median_decode_tok_s",
                     "rate_vs_default")""")),
    ("code", _src("""
        by_mode = {mode: group.sort("c") for (mode,), group in table.group_by(["kernel_mode"], maintain_order=True)}
        invariant = [mode for mode, group in by_mode.items() if (group["bit_identical_share"] == 1).all()]
        not_invariant = [mode for mode in by_mode if mode not in invariant]
        largest = table["c"].max()
        print(f"Finding: batch invariant (every request at every c bit-identical to m=1): {', '.join(invariant)}; "
              f"not: {', '.join(not_invariant)}.")
        for mode in not_invariant:
            group = by_mode[mode]
            print(f"  {mode}: bit-identical share per c {dict(zip(group['c'], group['bit_identical_share']))}, "
                  f"{group['token_flips'].sum()} token flips, up to {group['max_ulp'].max()} ULP")
        for mode in invariant:
            row = by_mode[mode].filter(pl.col("c") == largest).row(0, named=True)
            print(f"  {mode} at c={largest}: {row['median_decode_tok_s']:.0f} tok/s per request, "
                  f"{row['rate_vs_default']:.2f} of the default mode's rate")""")),
    ("code", _src("""
        fig, ax = plt.subplots(figsize=(7, 4))
        for mode, group in by_mode.items():
            ax.plot(group["c"], group["median_decode_tok_s"], marker="o", label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xticks(run.ladder, [str(c) for c in run.ladder])
        ax.set_xlabel("batch size c")
        ax.set_ylabel("median decode rate per request (tok/s)")
        ax.set_title("What each kernel mode costs")
        ax.legend()
        plt.show()""")),
    ("markdown", _src("""
        `one-by-one` buys parity by throwing batching away (each request steps alone), so its per-request rate falls
        as c grows; `fixed-tiles` keeps the batch and makes every reduction's shape independent of it, so it pays
        at c = 1 (a request alone fills a whole tile of 16) and little at c = 16. These runs time one band per c on a
        shared machine; `benchmarks/bench_kernels.py` takes the best of several rounds.""")),
]

TREND_TUTORIAL = [
    ("markdown", _src("""
        # 4. History and trend: bands over time, regressions flagged

        A parity study is not one run: a night's probe is compared with the nights before it. This notebook builds a
        history of witnesses and runs, adds to a history folder, and lets bia's regression rules find the night
        a band that used to be bit-identical to m=1 stopped being so.

        You will learn to:

        - read a history with `analysis.read_history` and find your way in `History.entries`, `bands` and `markers`;
        - keep a history folder with `analysis.append_history` (append-only: the same bytes are never added twice);
        - find regressions with `History.regressions()` and the rules in `analysis.REGRESSION_RULES`;
        - draw a metric over time with `analysis.plot_trend`.

        Everything is written to a temporary folder; the embedded data is only read.""")),
    ("code", _src("""
        import json
        import shutil
        import tempfile
        from pathlib import Path

        import matplotlib.pyplot as plt
        import polars as pl

        import analysis

        LAMBDA = Path(analysis.default_sources()[0])  # data/aprender-lambda
        RUNS = {Path(path).name: Path(path) for path in analysis.default_runs()}
        past = analysis.read_history(LAMBDA)
        past""")),
    ("markdown", _src("""
        `entries` has one row per witness or run, keyed by time, host, engine, model, server commit and settings. A
        witness carries no date of its own: it is dated by the release marker of its server commit
        (`time_origin`). `series_settings` names the settings that change results (a run's kernel mode, dtype, device,
        layout, prompt cache; a witness's environment switches): a series is a host, engine and model with one set of
        them, so the `BATCHED_PREFILL=0` variant is a series of its own and a change of setting is never a regression.
        `bands` has one row per entry and c with the measures a trend needs.""")),
    ("code", _src("""
        past.entries.select("kind", "time", "time_origin", "host", "engine", "model", "series_settings", pl.col("commit").str.slice(0, 10), "verdict",
                            pl.col("source").map_elements(lambda s: Path(s).name, return_dtype=pl.String))""")),
    ("code", _src("""
        past.bands.select(pl.col("entry").str.slice(0, 8), "c", "requests", "earliest_divergence", "bit_identical_share",
                          "token_identical_share", "decode_ratio", "result")""")),
    ("code", _src("""
        found = past.regressions()
        print(f"Finding: the embedded history holds {past.entries.height} witnesses, dated "
              f"{', '.join(past.entries['time'].dt.strftime('%Y-%m-%d %H:%M').unique())} by the marker of server commit "
              f"{', '.join(past.entries['commit'].unique().str.slice(0, 7))}; {found.height} regressions "
              f"(witnesses of one moment have no order to regress in).")""")),
    ("markdown", _src("""
        ## A history folder

        `append_history(sources, folder)` (the CLI's `bia history`) adds witnesses, markers and run directories to a
        folder: `history.json`, the originals, each run's manifest, and append-only Parquet parts. Appending the same
        sources again adds nothing, so a nightly job may append everything every night.""")),
    ("code", _src("""
        work = Path(tempfile.mkdtemp(prefix="bia-trend-"))
        folder = work / "history"
        history = analysis.append_history([LAMBDA], folder)
        history = analysis.append_history([RUNS["default"], RUNS["fixed-tiles"]], folder)
        again = analysis.append_history([LAMBDA, RUNS["default"]], folder)
        print(sorted(p.name for p in folder.iterdir()))
        print(f"{history.entries.height} entries after adding the witnesses, then two runs; appending the witnesses and a run "
              f"again left {again.entries.height}")""")),
    ("markdown", _src("""
        ## Two nights, and a regression

        To see a regression, make two nights from the embedded llama.cpp runs: night 1 is the run without the
        prompt cache (a request alone is bit-identical to m=1), night 2 the run with it, each copied and dated in its
        manifest (`started`) and given a server commit, as a nightly probe of a changed server would write them.""")),
    ("code", _src("""
        def night(source: Path, name: str, started: str, commit: str) -> Path:
            \"\"\"A copy of an embedded run, dated and from a given server commit.\"\"\"
            copy = work / "runs" / name
            shutil.copytree(source, copy, ignore=shutil.ignore_patterns("derived"))
            manifest = json.loads((copy / "manifest.json").read_text())
            manifest["started"] = started
            manifest["identity"]["commit"] = commit
            (copy / "manifest.json").write_text(json.dumps(manifest))
            return copy


        nights = work / "nights"
        analysis.append_history([night(RUNS["no-cache-prompt"], "2026-11-01", "2026-11-01T02:00:00Z", "a" * 40)], nights)
        history = analysis.append_history([night(RUNS["cache-prompt"], "2026-11-02", "2026-11-02T02:00:00Z", "c" * 40)], nights)
        history.bands.select("time", "c", "earliest_divergence", "bit_identical_share", "token_identical_share", "decode_ratio").sort("c", "time")""")),
    ("markdown", "The rules are data (`analysis.Rule`); `History.regressions()` applies `analysis.REGRESSION_RULES` by default."),
    ("code", "pl.DataFrame([{\"rule\": rule.name, \"what it flags\": rule.words} for rule in analysis.REGRESSION_RULES])"),
    ("code", _src("""
        found = history.regressions()
        print(f"Finding: {found.height} regression(s).")
        for row in found.iter_rows(named=True):
            print(f"  {row['rule']} at c={row['c']}: {row['words']} ({row['before']:g} -> {row['after']:g}); last good "
                  f"{row['last_good_time']:%Y-%m-%d} (commit {row['last_good_commit'][:7]}), first bad {row['first_bad_time']:%Y-%m-%d} "
                  f"(commit {row['first_bad_commit'][:7]})")
        found.select("rule", "c", "before", "after", "last_good_time", "first_bad_time")""")),
    ("markdown", _src("""
        `plot_trend` draws one metric of one series (`analysis.trend.series_keys`: host, engine, model and settings) over
        time: a line per c, release markers as labelled lines, each regression's first bad entry circled.""")),
    ("code", _src("""
        key = analysis.trend.series_keys(history)[0]
        fig, axes = plt.subplots(1, 2, figsize=(14, 3.8))
        analysis.plot_trend(history, key, "bit_identical_share", ax=axes[0])
        analysis.plot_trend(history, key, "token_identical_share", ax=axes[1])
        fig.tight_layout()
        plt.show()""")),
    ("markdown", _src("""
        The trend report (`bia trend history/ -o trend.html`, or `analysis.render_trend`) puts the regressions first and
        then these figures for every series; `05_report.ipynb` shows how bia renders such a report.""")),
    ("code", "shutil.rmtree(work)"),
]

REPORT_TUTORIAL = [
    ("markdown", _src("""
        # 5. The parity report: one offline HTML file

        `bia report` (in Python `analysis.render_report`) executes the report notebook `notebooks/parity_report.ipynb`
        with papermill, passing the sources and runs as parameters, then exports the executed notebook with nbconvert
        as one self-contained HTML file: code hidden, figures inlined as PNG with alt text, nothing loaded from the network.

        You will learn to render the report from Python, to look at it here and open it in a browser, and what a reader
        finds in it. With no sources and no runs it shows the embedded default: the real witnesses of notebook 1, the runs
        of notebook 2 and two of a real vLLM server (`analysis.default_runs()`). Rendering takes about 20 seconds: a second
        Jupyter kernel runs the report notebook. The page is written to `reports/` in the folder the notebook runs in, and
        kept: beside this notebook when JupyterLab opens it; where papermill runs it (its `--cwd`), or wherever `-p output
        PATH` says, under papermill.""")),
    ("parameters", "# Where to write the report, from the folder the kernel runs in (this notebook's in JupyterLab, papermill's --cwd),\n"
                   "# kept so that you can open it (running the notebook again replaces it).\noutput: str = \"reports/parity-report.html\""),
    ("code", _src("""
        import html
        import re
        from pathlib import Path

        from IPython.display import FileLink, IFrame, display

        import analysis

        target = Path(output).resolve()  # said in full: the folder the kernel runs in is not always the notebook's
        target.parent.mkdir(parents=True, exist_ok=True)
        path = analysis.render_report(output=target, title="Batch-parity report (tutorial)", force=True)  # force: this notebook's own report
        page = path.read_text(encoding="utf-8")
        print(f"{path}: {len(page) / 1e6:.1f} MB")""")),
    ("markdown", _src("""
        Here it is as a browser shows it (scroll inside the frame), and a link that opens it in a tab of its own. The file
        stays where `output` put it.""")),
    ("code", _src("""
        display(FileLink(str(path)))
        display(IFrame(str(path), width="100%", height=640))""")),
    ("markdown", _src("""
        The page opens offline: no script or stylesheet comes from the network, and every figure is inlined. Its
        sections are in the order a reviewer reads: the answer first (one row per run and witness, from
        `analysis.judge`), then the verdict cards, the figures and detail (collapsed), aprender's V3 release gate, and
        parameters and provenance.""")),
    ("code", _src("""
        def text(fragment: str) -> str:
            \"\"\"The words of an HTML fragment.\"\"\"
            return html.unescape(" ".join(re.sub(r"<[^>]+>", " ", fragment).split()))


        sections = [text(h) for h in re.findall(r"<h2[^>]*>(.*?)</h2>", page, flags=re.S)]
        figures = len(re.findall(r'<img\\b[^>]*src="data:image/png;base64,', page))
        collapsed = [text(s) for s in re.findall(r"<summary[^>]*>(.*?)</summary>", page, flags=re.S)]
        remote = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(?:https?:)?//', page)
        print(f"title: {text(re.search(r'<title>(.*?)</title>', page, flags=re.S).group(1))}")
        print(f"sections: {' | '.join(sections)}")
        print(f"collapsed parts: {len(collapsed)}")
        print(f"{figures} figures inlined as PNG; {len(remote)} scripts or stylesheets from the network")""")),
    ("markdown", _src("""
        The answer table opens the page: each row carries its run, arm and verdict as `data-` attributes, the same
        verdict `bia certify` exits with. Each run and each witness file then gets a card whose headline is that
        verdict and its reason.""")),
    ("code", _src("""
        rows = re.findall(r"<tr ([^>]*data-verdict[^>]*)>", page)
        answer = [dict(re.findall(r'([\\w-]+)="([^"]*)"', attributes)) for attributes in rows]
        print("Finding: the answer says " + ", ".join(f"{Path(row['data-run']).name} {row['data-verdict']}" for row in answer))""")),
    ("code", _src("""
        cards = re.findall(r'<article class="bia-card bia-review.*?<code>(.*?)</code>.*?<p class="bia-headline[^"]*">(.*?)</p>', page, flags=re.S)
        print(f"Finding: the report's {len(cards)} verdict cards say")
        for name, headline in cards:
            print(f"  {Path(text(name)).name}: {text(headline)}")""")),
    ("markdown", _src("""
        The same from a shell: `bia report -o parity-report.html` (the embedded default), `bia report RUN_DIR... -o
        report.html` for your runs, or `papermill notebooks/parity_report.ipynb out.ipynb -p title ...` to keep the
        executed notebook. This notebook's `output` parameter puts the page elsewhere.""")),
]

RL_MISMATCH = [
    ("markdown", _src("""
        # Sampler vs trainer: every RL framework's mismatch metrics, and KL exactly 0

        An RL loop samples with an inference engine and scores the same tokens again in the trainer, in one forward pass
        over prompt and completion. Batch variance is one reason the two logprobs disagree; a trainer's one pass against a
        sampler's token-by-token decode is another. `bia experiment --trainer` recomputes every sequence of the bundled
        experiment runs as a trainer does, in each kernel mode, and writes the pairs as prime-rl token exports
        (`data/experiment-cpu/trainer/`). This notebook reads them.

        You will learn to:

        - read sampler-trainer pairs with `analysis.read_dump` and score them with `analysis.mismatch_summary`: one
          column per `framework:logged name` (verl, slime, miles, prime-rl, OpenRLHF, SkyRL), each with its own averaging;
        - check "KL exactly 0": every metric at its value for no mismatch at all, in the kernel mode whose one-pass
          forward gives the decode's bits, and not in the others;
        - look at the per-token `delta = trainer - rollout` logprob: its distribution, against position and against the
          sampler's top-1/top-2 margin, and the sequences with the largest K3.

        Run it in JupyterLab or with papermill (`-y 'pairs: [runs/exp/trainer/default.jsonl]'` for your own pairs).""")),
    ("parameters", "# Sampler-trainer pairs (prime-rl token exports); empty: the bundled experiment runs' pairs and the vLLM-transformers pair.\npairs: list = []"),
    ("code", _src("""
        from pathlib import Path

        import matplotlib.pyplot as plt
        import polars as pl

        import analysis
        from analysis import report

        PAIRS = [Path(p) for p in pairs] or [*report.trainer_pairs(analysis.default_runs()), *map(Path, report.default_rl_pairs())]  # bundled
        name_of = lambda path: path.stem if path.parent.name == "trainer" else f"{path.parent.name}/{path.stem}"  # noqa: E731
        summaries = {name_of(path): analysis.mismatch_summary(analysis.read_dump(path)) for path in PAIRS}
        pl.concat([s.select("bia:sequences", "bia:masked_tokens", "verl:rollout_corr/k3_kl", "prime-rl:mismatch_kl/all/max",
                            "slime:train/train_rollout_logprob_abs_diff", "openrlhf:vllm_kl").with_columns(run=pl.lit(name))
                   for name, s in summaries.items()]).select("run", pl.exclude("run"))""")),
    ("markdown", _src("""
        Each file is one run's sequences (its two m=1 references and every batched request), scored by the trainer
        eight to a forward pass. `report.mismatch_summaries` puts every metric of every run side by side, one row
        per framework and logged name.""")),
    ("code", "table = report.mismatch_summaries(PAIRS)\ntable"),
    ("markdown", _src("""
        "Exactly 0" means every metric is at the value it takes when the trainer's logprob *is* the sampler's: a KL or a
        difference 0, a ratio or a correlation 1, and verl's `chi2_token` a hair below 0 (verl divides token means by the
        count + 1e-8). So the check compares each run's summary with the summary of the same tokens with the trainer's
        logprob set to the sampler's.""")),
    ("code", _src("""
        def no_mismatch(path) -> pl.DataFrame:
            \"\"\"The same tokens scored as if the trainer had returned the sampler's logprobs.\"\"\"
            tokens = analysis.read_dump(path).tokens
            return analysis.mismatch_summary(tokens.select(sequence="record", position="position", rollout_logprob="logprob",
                                                           trainer_logprob="logprob", mask=pl.lit(True)))


        for path in PAIRS:
            name, summary = name_of(path), summaries[name_of(path)]
            exact = summary.drop("bia:sequences").rows() == no_mismatch(path).drop("bia:sequences").rows()
            k3 = summary["verl:rollout_corr/k3_kl"].item()
            print(f"Finding: {name}: " + ("every metric exactly at its no-mismatch value (K3 0.0)" if exact
                                          else f"not zero: verl's K3 {k3:.3g}, SkyRL's max |delta| "
                                               f"{summary['skyrl:policy/rollout_train_logprobs_abs_diff_max'].item():.3g}"))""")),
    ("markdown", _src("""
        `fixed-tiles` reaches 0 because its prefill computes every query the way a decode step does; `default` parts by
        batching and by prefill against decode; `batch-invariant` (the `one-by-one` mode) is batch invariant, yet its
        prompt pass runs matmuls of another shape than its decode steps, so it parts too: batch invariance alone is not
        enough for an RL trainer. Below, every token's `delta`, with the sampler's margin from the run beside the pairs.""")),
    ("code", _src("""
        tokens = report.mismatch_tokens(PAIRS)
        parted = tokens.filter(pl.col("delta") != 0)
        by_run = tokens.group_by("run", maintain_order=True).agg(tokens=pl.len(), parted=(pl.col("delta") != 0).sum(),
                                                                 max_abs_delta=pl.col("delta").abs().max())
        for row in by_run.iter_rows(named=True):
            print(f"{row['run']}: {row['parted']} of {row['tokens']} tokens part, by up to {row['max_abs_delta']:.2g} nats")
        if parted.height:
            print(f"the smallest sampler margin where a token parts is {parted['margin'].min():.3g} nats: "
                  f"far above any |delta|, so no sampled token would change")
        by_run""")),
    ("code", _src("""
        for fig, alt in report.rl_mismatch_figures(PAIRS):
            fig.suptitle(alt, fontsize="small")
        plt.show()""")),
    ("markdown", "The sequences with the largest K3 (token mean) in each run, and where their tokens first part:"),
    ("code", "report.largest_k3(PAIRS, n=3)"),
    ("markdown", _src("""
        To make pairs of your own: `bia experiment -o runs/exp --trainer` decodes and recomputes (`--trainer-batch` sets
        the trainer's micro-batch), or `bia experiment -o runs/exp --trainer --recompute runs/exp/default` recomputes a run
        already decoded. Any prime-rl token export (`inference_logprobs`, `trainer_logprobs`, `loss_mask`) reads the same
        way, and `analysis.mismatch_table` gives the per-sequence view.""")),
]

NOTEBOOKS = {
    "parity_report.ipynb": ("Batch-parity report", CELLS),
    "03_probe.ipynb": ("Probe a server across batch sizes", WALKTHROUGH),
    "trend_report.ipynb": ("Batch-invariance trend", TREND),
    "01_witnesses.ipynb": ("1. Parity witnesses", WITNESSES),
    "02_dumps_and_runs.ipynb": ("2. Logprob dumps and run directories", DUMPS_AND_RUNS),
    "04_trend.ipynb": ("4. History and trend", TREND_TUTORIAL),
    "05_report.ipynb": ("5. The parity report", REPORT_TUTORIAL),
    "rl_mismatch.ipynb": ("Sampler vs trainer", RL_MISMATCH),
}
# The notebooks bia report and bia trend execute: their output is the report. The others are tutorials (tests/test_tutorials.py).
TEMPLATES = ("parity_report.ipynb", "trend_report.ipynb")


def build(cells_source=CELLS, title: str = "Batch-parity report") -> nbformat.NotebookNode:
    cells = []
    for index, (kind, source) in enumerate(cells_source):
        if kind == "markdown":
            cells.append(new_markdown_cell(source))
        else:
            cell = new_code_cell(source)
            if kind == "parameters":
                cell.metadata["tags"] = ["parameters"]
            cells.append(cell)
        cells[-1].id = f"cell-{index}"  # stable ids: regenerating gives the same file
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.metadata["title"] = title
    return nb


if __name__ == "__main__":
    for name, (title, cells_source) in NOTEBOOKS.items():
        target = Path(__file__).resolve().parent.parent / "notebooks" / name
        nbformat.write(build(cells_source, title), target)
        print(f"wrote {target}")
