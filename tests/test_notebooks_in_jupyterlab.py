"""Issue 44: tutorials 01-03 run in a real JupyterLab under Chromium (1400 x 1000, the file browser open, 100% zoom), as a
reader sees them: no figure text under 9 px as rendered, no warning and no ``Axes`` repr in any output, and the verdict
colours of bia's cards in the light and the dark theme.

How a text's rendered size is measured: the kernel records, as it draws each figure's PNG, every visible text's size in
points and the figure's dpi (an IPython startup file wraps ``print_figure``, which the inline backend calls); the browser
gives each PNG its rendered and natural widths. A text of ``s`` points is
then ``s * dpi / 72 * rendered / natural`` px on the screen.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.browser]

TUTORIALS = ["01_witnesses.ipynb", "02_dumps_and_runs.ipynb", "03_probe.ipynb"]
SMALLEST_PX = 9
COLOURS = {"light": {"bia-fail": "rgb(207, 34, 46)", "bia-warn": "rgb(154, 103, 0)"},
           "dark": {"bia-fail": "rgb(255, 123, 114)", "bia-warn": "rgb(210, 153, 34)"}}

RECORDER = '''
import json, os
import IPython.core.pylabtools as pylabtools

_print_figure = pylabtools.print_figure


def _bia_print_figure(fig, fmt="png", *args, **kwargs):
    # each figure the inline backend shows passes here once per format: its texts' sizes, in order
    sizes = [t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text"))
             if t.get_visible() and t.get_text().strip() and (t.axes is None or t.axes.get_visible())]
    notebook = os.path.basename(os.environ.get("JPY_SESSION_NAME", "unknown"))  # the server names the kernel's notebook
    with open(os.path.join(os.environ["BIA_FIGURE_DIR"], notebook + ".figures.jsonl"), "a") as log:
        log.write(json.dumps({"format": fmt, "dpi": fig.dpi, "smallest_pt": min(sizes) if sizes else None}) + "\\n")
    return _print_figure(fig, fmt, *args, **kwargs)


pylabtools.print_figure = _bia_print_figure  # before the inline backend binds it to its formatters
'''

SETTINGS = {  # no news pop-up over the notebook, every cell laid out (not only those in view)
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def _chromium() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        pytest.skip("no Chromium")
    return path


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on a free port over a folder holding copies of the tutorials, its kernel recording the figures
    it shows (``RECORDER``)."""
    pytest.importorskip("playwright")
    pytest.importorskip("torch")  # 03_probe serves the tiny model with bia serve
    work = tmp_path_factory.mktemp("lab")
    for name in TUTORIALS:
        shutil.copy(ROOT / "notebooks" / name, work / name)
    startup = work / ".ipython" / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-bia-record-figures.py").write_text(RECORDER)
    for name, values in SETTINGS.items():
        path = work / ".settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "IPYTHONDIR": str(work / ".ipython"), "PYTHONPATH": str(ROOT), "JUPYTERLAB_SETTINGS_DIR": str(work / ".settings"),
           "JUPYTER_CONFIG_DIR": str(work / ".jupyter"), "MPLBACKEND": "module://matplotlib_inline.backend_inline",
           "BIA_FIGURE_DIR": str(work)}
    venv = Path(os.sys.executable).parent
    server = subprocess.Popen([str(venv / "jupyter-lab"), "--no-browser", f"--port={port}", "--ServerApp.token=", "--ServerApp.password=",
                               "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={work}", "--allow-root"],
                              env=env, cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", work, env
    finally:
        server.terminate()
        server.wait(20)


def _run_all(page, url: str, name: str) -> None:
    page.goto(f"{url}/lab/tree/{name}?reset")  # a fresh workspace: this notebook alone
    page.wait_for_selector(".jp-Notebook", timeout=120_000)
    page.wait_for_timeout(1500)
    if page.locator(".jp-Dialog").count():  # which kernel: the notebook's own
        page.get_by_role("button", name="Select").click()
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    page.wait_for_timeout(1000)
    page.wait_for_function("""() => { const prompts = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')];
        return prompts.length && prompts.every(p => /\\[\\d+\\]/.test(p.textContent)); }""", timeout=300_000)
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
    page.wait_for_timeout(500)


def _theme(page, name: str) -> None:
    label = page.locator(".lm-Menu-itemLabel")
    page.get_by_role("menuitem", name="Settings", exact=True).click()
    label.filter(has_text=re.compile(r"^Theme$")).click()  # a submenu: no menuitem role
    label.filter(has_text=re.compile(rf"^JupyterLab {name.title()}$")).click()
    page.wait_for_function(f"() => document.body.dataset.jpThemeLight === '{'true' if name == 'light' else 'false'}'", timeout=30_000)
    page.wait_for_timeout(500)


COLOURS_JS = """() => Object.fromEntries(['bia-fail', 'bia-warn'].map(c => [c,
    [...new Set([...document.querySelectorAll('.bia-jupyter .' + c)].map(e => getComputedStyle(e).color))]]))"""


def test_the_tutorials_in_jupyterlab(lab):
    from playwright.sync_api import sync_playwright

    url, work, _ = lab
    found: dict[str, dict] = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        for name in TUTORIALS:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            log = work / f"{name}.figures.jsonl"
            log.write_text("")
            _run_all(page, url, name)
            state = page.evaluate("""() => ({
                images: [...document.querySelectorAll('.jp-RenderedImage img')].map(i => ({shown: i.getBoundingClientRect().width,
                                                                                          natural: i.naturalWidth})),
                outputs: [...document.querySelectorAll('.jp-OutputArea-output')].map(o => o.innerText),
                stderr: [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')]
                         .map(o => o.innerText),
                errors: document.querySelectorAll('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.error"]').length,
                area: document.querySelector('.jp-OutputArea-output')?.getBoundingClientRect().width,
                cells_left_aligned: [...document.querySelectorAll('.bia-jupyter td')].every(td => getComputedStyle(td).textAlign === 'left'),
            })""")
            state["figures"] = [f for line in log.read_text().splitlines() if (f := json.loads(line))["format"] == "png"]
            state["colours"] = {"light": page.evaluate(COLOURS_JS)}
            _theme(page, "dark")
            state["colours"]["dark"] = page.evaluate(COLOURS_JS)
            _theme(page, "light")
            found[name] = state
            page.get_by_role("menuitem", name="Kernel", exact=True).click()
            page.get_by_role("menuitem", name="Shut Down Kernel", exact=True).click()
            page.wait_for_timeout(500)
            page.close()
        browser.close()
    for name, state in found.items():
        assert state["errors"] == 0, name
        assert state["stderr"] == [] or not any("Warning" in text for text in state["stderr"]), (name, state["stderr"])
        assert not any("Warning:" in text or "<Axes:" in text or "<Figure size" in text for text in state["outputs"]), name
        assert state["images"] and len(state["images"]) == len(state["figures"]), (name, len(state["images"]), len(state["figures"]))
        rendered = [f["smallest_pt"] * f["dpi"] / 72 * i["shown"] / i["natural"] for f, i in zip(state["figures"], state["images"])
                    if f["smallest_pt"]]
        assert min(rendered) >= SMALLEST_PX, (name, [round(px, 1) for px in rendered], state["area"])
        print(f"{name}: output {state['area']:.0f} px wide; smallest figure text {min(rendered):.1f} px")
        assert state["cells_left_aligned"], name
        for theme, colours in state["colours"].items():
            for css, seen in colours.items():
                assert set(seen) <= {COLOURS[theme][css]}, (name, theme, css, seen)
    # every tutorial shows bia's verdict in its colour somewhere, in both themes
    assert any(state["colours"]["light"]["bia-fail"] for state in found.values())
    assert any(state["colours"]["dark"]["bia-fail"] for state in found.values())
