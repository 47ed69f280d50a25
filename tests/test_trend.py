"""Histories and the trend report: the embedded history, a planted regression found and named, and
two nights of the scheduled recipe (scripts/nightly.sh) run for real."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import LAMBDA, ROOT
from typer.testing import CliRunner

import analysis
from analysis import HistoryError, append_history, read_history
from analysis.io._sources import SourceRepeated
from analysis.cli import app

pytestmark = pytest.mark.slow

NO_CACHE = ROOT / "data" / "llamacpp-cpu" / "no-cache-prompt"  # c=1 alone repeats m=1 bit for bit
CACHED = ROOT / "data" / "llamacpp-cpu" / "cache-prompt"  # the prompt cache makes c=1 differ from m=1 in bits


def _night(tmp_path: Path, source: Path, name: str, started: str, commit: str) -> Path:
    """A copy of a bundled llama.cpp run, dated and from a given server commit."""
    folder = tmp_path / "runs" / name
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("derived"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["started"] = started
    manifest["identity"]["commit"] = commit
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def _marker(tmp_path: Path, commit: str, when: str) -> Path:
    path = tmp_path / "markers" / f"marker@{commit[:10]}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"cc": "cpu", "commit": commit, "exit": 0, "host": "vm", "max_m": 16, "started_utc": when, "status": "PASS"}))
    return path


def _text(page: str) -> str:
    page = re.sub(r"<(style|script)\b.*?</\1>", " ", page, flags=re.S)
    return " ".join(re.sub(r"<[^>]+>", " ", page).split())


def test_the_embedded_history_over_two_server_commits():
    history = read_history(LAMBDA)
    assert history.entries.height == 3 and set(history.entries["kind"]) == {"witness"}
    assert history.markers.sort("time")["commit"].str.slice(0, 7).to_list() == ["a765c86", "c554a77"]
    # each witness is dated by the release marker of its server commit
    assert history.entries["time"].dt.strftime("%Y-%m-%d %H:%M:%S").unique().to_list() == ["2026-09-02 14:59:58"]
    assert set(history.entries["time_origin"]) == {"release marker"}
    v2 = history.bands.join(history.entries.filter(pl.col("source").str.ends_with("witness@464c168e62.json")).select("entry"), on="entry")
    assert v2.sort("c")["earliest_divergence"].to_list() == [100, 3, 3, 3]  # the file: c=1 parts at 100 (as ref #2 did), c>1 at 3
    assert history.regressions().is_empty()  # three witnesses of one moment: no order to regress in
    # a witness's series holds its environment switches: the BATCHED_PREFILL=0 variant is a series of its own
    assert sorted(history.entries.group_by("series_settings").len().rows()) == [
        ("BATCHED_PREFILL=0, CUDA_BATCH_WINDOW_MS=200", 1), ("CUDA_BATCH_WINDOW_MS=200", 2)]
    assert repr(history) == "History(3 entries in 2 series, 12 bands, 2 markers)"
    assert history.bands.join(history.entries, on="entry").filter(pl.col("series_settings") != pl.col("series_settings_right")).is_empty()


def test_a_planted_regression_is_flagged_with_the_first_bad_entry_and_the_commits_between(tmp_path):
    good = _night(tmp_path, NO_CACHE, "2026-11-01", "2026-11-01T02:00:00Z", "a" * 40)
    bad = _night(tmp_path, CACHED, "2026-11-03", "2026-11-03T02:00:00Z", "c" * 40)
    marker = _marker(tmp_path, "b" * 40, "2026-11-02T12:00:00Z")  # a release between the two nights
    history = read_history([good, bad, marker])
    found = history.regressions()
    bits = found.filter(rule="bits differ")
    assert bits.select("c", "before", "after").rows() == [(1, 1.0, 0.0)]  # c=1 was bit-identical to m=1, and is not
    row = bits.row(0, named=True)
    first_bad = history.entries.filter(pl.col("entry") == row["first_bad_entry"])["source"].item()
    assert first_bad == str(bad) and row["last_good_commit"] == "a" * 40 and row["first_bad_commit"] == "c" * 40
    assert row["commits_between"] == ["a" * 40, "b" * 40, "c" * 40]
    assert found.filter(rule="tokens part").is_empty()  # no token parted in either night

    page = analysis.render_trend([good, bad, marker], tmp_path / "trend.html").read_text()
    text = _text(page)
    assert "1 regression(s)" in text and "requests that were bit-identical to m=1 are not" in text
    assert str(bad) in text and "aaaaaaaaaa, bbbbbbbbbb, cccccccccc" in text
    assert len(re.findall(r"<img\b", page)) >= 3 and "Traceback" not in text and "Warning" not in text


def test_a_history_folder_grows_and_never_takes_an_entry_twice(tmp_path):
    folder = tmp_path / "history"
    first = append_history([LAMBDA], folder)
    with pytest.warns(SourceRepeated, match="given again; it is read once"):
        again = append_history([LAMBDA, LAMBDA / "witness@464c168e62.json"], folder)
    assert first.entries.height == again.entries.height == 3 and again.markers.height == 2
    assert len(list((folder / "entries").glob("part-*.parquet"))) == 1  # the second append added nothing
    assert sorted(p.name.split("-", 1)[1] for p in (folder / "originals").iterdir()) == sorted(
        p.name for p in LAMBDA.glob("*.json"))
    with pytest.raises(HistoryError, match="history_version"):
        (folder / "history.json").write_text('{"history_version": 9}')
        read_history([folder])


def test_a_folder_that_is_not_a_history_is_not_taken_over(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["history", str(LAMBDA), "-o", str(tmp_path)])
    assert result.exit_code == 2 and "a history folder holds history.json" in result.stderr
    assert not (tmp_path / "history.json").exists()


def test_append_history_reads_everything_before_it_touches_the_folder(tmp_path):
    """append_history stamped history.json (the current version) before it read anything: a folder of another version was
    taken over, and a bad source left a new folder behind."""
    old = tmp_path / "old"
    old.mkdir()
    (old / "history.json").write_text('{"history_version": 9}')
    with pytest.raises(HistoryError, match="history_version 9 is not 1"):
        append_history(LAMBDA, old)
    assert [p.name for p in old.iterdir()] == ["history.json"] and (old / "history.json").read_text() == '{"history_version": 9}'
    with pytest.raises(FileNotFoundError, match="no such file"):
        append_history(tmp_path / "absent.json", tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_append_history_refuses_a_folder_of_other_files_without_offering_a_force_it_does_not_take(tmp_path):
    from analysis import OutputExists, append_history

    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputExists, match="holds something that is not a bia history") as caught:
        append_history(LAMBDA, tmp_path)
    assert "force" not in str(caught.value) and (tmp_path / "notes.txt").read_text() == "mine"
    assert append_history(LAMBDA, tmp_path / "empty").entries.height == 3  # a new folder becomes one


def test_bia_trend_with_no_arguments_renders_the_embedded_history(tmp_path):
    result = CliRunner().invoke(app, ["trend", "-o", str(tmp_path / "trend.html"), "--title", "Nightly <trend>"])
    assert result.exit_code == 0, result.stderr
    page = (tmp_path / "trend.html").read_text()
    assert "<title>Nightly &lt;trend&gt;</title>" in page
    assert len(re.findall(r'<img\b[^>]*src="data:image/png;base64,', page)) >= 1
    assert "(none given: the embedded history)" in _text(page) and "No regression" in _text(page)
    # issue 22, item 6: the three witnesses share one time and one server commit, and the page says so
    assert "3 entries in 2 series (host, engine, model and the settings that change results), all at 2026-09-02 14:59 UTC: " \
           "one moment, so no trend over time yet; 2 release marker(s)" in _text(page)
    assert "two server commits" not in analysis.trend.default_history_sources.__doc__


def test_two_nights_of_the_recipe(tmp_path):
    """scripts/nightly.sh, run twice as cron would, on two runs: a history with both nights and a trend over them."""
    nights = [("2026-11-01", _night(tmp_path, NO_CACHE, "n1", "2026-11-01T02:00:00Z", "a" * 40)),
              ("2026-11-02", _night(tmp_path, CACHED, "n2", "2026-11-02T02:00:00Z", "c" * 40))]
    history, reports = tmp_path / "history", tmp_path / "reports"
    for night, run in nights:
        env = {**os.environ, "BIA_NIGHT": night, "BIA": f"{sys.executable} -m analysis"}
        done = subprocess.run(["bash", str(ROOT / "scripts" / "nightly.sh"), str(run), str(history), str(reports)],
                              capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in reports.iterdir()) == ["parity-2026-11-01.html", "parity-2026-11-02.html", "trend.html"]
    past = read_history([history])
    assert past.entries.sort("time")["source"].to_list() == [str(nights[0][1]), str(nights[1][1])]
    text = _text((reports / "trend.html").read_text())
    assert "2 entries in 1 series" in text and "1 regression(s)" in text


def _probe_bia_serve(mode: str, out: Path) -> Path:
    """bia serve in ``mode`` on loopback, probed once: one short prompt, ladder 1, 2, 4, 8 tokens."""
    import asyncio

    from analysis.probe import probe
    from analysis.serve import BackgroundServer

    out.parent.mkdir(parents=True, exist_ok=True)
    with BackgroundServer(mode, log_file=out.parent / f"{out.name}.log") as server:
        return asyncio.run(probe(server.url, out, prompts=["If the argument is"], ladder=(1, 2, 4), max_tokens=8, top_logprobs=2,
                                 declared_min=4, server_log=out.parent / f"{out.name}.log", say=lambda line: None))


def _plant_bits(run: Path, copy: Path, started: str) -> Path:
    """A copy of ``run``, dated ``started``, whose first band request at c=2 has its first logprob changed in the last bit shown."""
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("derived"))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["started"] = started
    (copy / "manifest.json").write_text(json.dumps(manifest))
    lines = (copy / "captures" / "requests.jsonl").read_text().splitlines()
    target = next(i for i, line in enumerate(lines) if json.loads(line)["unit"].endswith("/band/c2/r0"))
    row = json.loads(lines[target])
    row["sse"] = re.sub(r'"logprob": ?(-[0-9.]+)', lambda m: f'"logprob": {float(m.group(1)) - 0.25}', row["sse"], count=1)
    lines[target] = json.dumps(row)
    (copy / "captures" / "requests.jsonl").write_text("\n".join(lines) + "\n")
    return copy


@pytest.mark.engine
def test_a_change_of_kernel_mode_starts_a_series_and_is_no_regression(tmp_path):
    """Issue 22, item 1: bia serve probed in default, fixed-tiles, fixed-tiles, default, each added with bia history to one folder."""
    pytest.importorskip("torch")
    history = tmp_path / "history"
    runs = []
    for k, mode in enumerate(["default", "fixed-tiles", "fixed-tiles", "default"]):
        runs.append(_probe_bia_serve(mode, tmp_path / "runs" / f"{k}-{mode}"))
        added = CliRunner().invoke(app, ["history", str(runs[-1]), "-o", str(history)])
        assert added.exit_code == 0, added.stderr
    past = read_history([history])
    assert past.entries.height == 4
    assert json.loads(past.entries.sort("time")["settings"][1])["kernel_mode"] == "fixed-tiles"
    fixed = past.bands.join(past.entries.filter(pl.col("source").is_in([str(r) for r in runs[1:3]])).select("entry"), on="entry")
    assert fixed["bit_identical_share"].to_list() == [1.0] * 6  # fixed-tiles keeps every band's bits: a good series to regress from
    found = past.regressions()
    # No rule fires: not across the change of mode, and not on the decode ratios, which one request at c=1 leaves without
    # an interval (timing noise of shared CPU cores, not a measurement: the decode rules judge only ratios with one).
    assert found.is_empty()
    assert past.bands.filter(pl.col("c") > 1)["decode_ratio"].null_count() == 0  # the ratios are there, shown, not judged
    assert past.bands["decode_ratio_low"].null_count() == past.bands.height
    assert sorted(past.entries["series_settings"].unique().to_list()) == [
        "kernel_mode=default, dtype=float32, device=cpu, layout=copies", "kernel_mode=fixed-tiles, dtype=float32, device=cpu, layout=copies"]

    result = CliRunner().invoke(app, ["trend", str(history), "-o", str(tmp_path / "trend.html")])
    assert result.exit_code == 0, result.stderr
    page = (tmp_path / "trend.html").read_text()
    text = _text(page)
    assert "4 entries in 2 series" in text and "0 regression(s)" in text
    assert "No regression: no band that was good by a rule is worse in a later entry of its series." in text
    assert "<td>requests that were bit-identical to m=1 are not</td>" not in page and "<td>a band that held to its end now parts" not in page
    assert text.count("kernel_mode=fixed-tiles, dtype=float32, device=cpu, layout=copies") >= 3  # its heading and its two entries
    assert re.search(r"<th>settings</th>", page)

    # a real regression within one series is still found: a fixed-tiles night, an hour after the last, whose bits moved at c=2
    last = past.entries.filter(pl.col("source") == str(runs[2]))["time"].item()
    planted = _plant_bits(runs[2], tmp_path / "runs" / "planted", (last + dt.timedelta(hours=1)).isoformat())
    found = read_history([history, planted]).regressions().filter(pl.col("rule").is_in(["bits differ", "tokens part"]))
    assert found.select("rule", "c", "before", "after").rows() == [("bits differ", 2, 1.0, 0.5)]
    row = found.row(0, named=True)
    assert row["series_settings"] == "kernel_mode=fixed-tiles, dtype=float32, device=cpu, layout=copies"
    assert row["last_good_entry"] == past.entries.filter(pl.col("source") == str(runs[2]))["entry"].item()


def _labels(ax) -> dict[str, object]:
    """The release-marker labels drawn on ``ax``, by text, with their extents on the drawn canvas."""
    ax.figure.canvas.draw()
    renderer = ax.figure.canvas.get_renderer()
    return {t.get_text(): t.get_window_extent(renderer) for t in ax.texts if t.get_text()}


def test_the_embedded_trend_spans_its_day_and_the_release_after_it_not_four_years():
    """Issue 22, item 6: three witnesses of one moment drew an x-axis from 2024-07 to 2028-07."""
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    history = read_history(LAMBDA)
    for key in analysis.trend.series_keys(history):
        for metric in ("earliest_divergence", "token_identical_share", "decode_ratio"):
            fig, ax = plt.subplots(figsize=(8, 3.2))
            analysis.plot_trend(history, key, metric, ax=ax)
            low, high = (mdates.num2date(x) for x in ax.get_xlim())
            # the entries (2026-09-02 14:59:58) and the next release (c554a77, 2026-09-09 18:15:37), padded by a twentieth
            assert dt.datetime(2026, 9, 2, tzinfo=dt.UTC) < low < dt.datetime(2026, 9, 2, 14, 59, 58, tzinfo=dt.UTC)
            assert dt.datetime(2026, 9, 9, 18, 15, 37, tzinfo=dt.UTC) < high < dt.datetime(2026, 9, 10, 12, tzinfo=dt.UTC)
            assert sorted(_labels(ax)) == ["a765c86", "c554a77"]
            if metric.endswith("_share"):
                assert ax.get_ylim() == (-0.05, 1.05)  # a share is drawn on its whole range, not around one value
            plt.close(fig)


def test_one_moment_alone_is_padded_by_half_a_day_each_side():
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    history = read_history([LAMBDA / "witness@464c168e62.json"])  # no marker: dated when read
    fig, ax = plt.subplots()
    analysis.plot_trend(history, analysis.trend.series_keys(history)[0], "earliest_divergence", ax=ax)
    low, high = (mdates.num2date(x) for x in ax.get_xlim())
    moment = history.entries["time"].item()
    assert (moment - low, high - moment) == (dt.timedelta(hours=12), dt.timedelta(hours=12))
    plt.close(fig)


def test_release_labels_close_together_do_not_overlap(tmp_path):
    import matplotlib.pyplot as plt

    good = _night(tmp_path, NO_CACHE, "2026-11-01", "2026-11-01T02:00:00Z", "a" * 40)
    bad = _night(tmp_path, CACHED, "2026-11-03", "2026-11-03T02:00:00Z", "e" * 40)
    # three releases within an hour, between two nights: their labels would be drawn on top of each other
    marks = [_marker(tmp_path, commit * 40, f"2026-11-02T12:{minute}:00Z") for commit, minute in (("b", "00"), ("c", "20"), ("d", "40"))]
    history = read_history([good, bad, *marks])
    fig, ax = plt.subplots(figsize=(8, 3.2))
    analysis.plot_trend(history, analysis.trend.series_keys(history)[0], "bit_identical_share", ax=ax)
    labels = _labels(ax)
    assert sorted(labels) == ["bbbbbbb", "ccccccc", "ddddddd"]
    boxes = list(labels.values())
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    assert all(box.y0 >= ax.get_window_extent().y1 for box in boxes)  # above the plot, clear of the lines
    plt.close(fig)
