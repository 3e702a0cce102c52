"""`remat-explorer app` in a real headless Chromium: profile, sweep, slide, export, verify.

Needs chromium (or chromium-browser) on the PATH and the playwright package. Without them the
test is skipped on a developer's machine, but fails in CI (where CI is set and both are
installed), so a broken install cannot pass as a skip.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from remat_explorer.apps.launch import stop

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "tests" / "output"
CHROMIUM = next(
    (path for path in map(shutil.which, ("chromium", "chromium-browser")) if path),
    "/usr/bin/chromium",
)
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
START_TIMEOUT_S = 120
JOB_TIMEOUT_MS = 300_000

PLOT_DATA = """sel => {
    const plot = document.querySelector(sel + ' .js-plotly-plot');
    return plot.data.map(t => ({name: t.name, x: Array.from(t.x || []), y: Array.from(t.y || [])}));
}"""
STATUS_HAS = "text => document.querySelector('.remat-status').innerText.includes(text)"
SELECTED_AT = f"x => ({PLOT_DATA})('.remat-pareto')[3].x[0] === x"
TIMELINE_CHANGED = f"""before => JSON.stringify(({PLOT_DATA})('.remat-timeline')[1].y)
    !== JSON.stringify(before)"""

pytestmark = [pytest.mark.browser, pytest.mark.serial]  # timeouts: alone (scripts/test.sh)


@pytest.fixture
def start_playwright():
    """playwright's `sync_playwright`, or a skip (a failure under CI) if something is missing."""
    missing = [] if Path(CHROMIUM).exists() else [CHROMIUM]
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("the playwright package")
    if missing:
        message = f"the browser test needs {' and '.join(missing)}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return sync_playwright


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_voila(process: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the app exited with {process.returncode}"
        try:
            with urllib.request.urlopen(url + "voila/static/voila.js", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"Voila did not answer on {url} within {START_TIMEOUT_S} s")


@pytest.fixture
def app(tmp_path):
    """`remat-explorer app` on a free port with a tiny model; exports land in tmp_path."""
    port = _free_port()
    env = _env()
    command = [
        sys.executable, "-m", "explorer.cli", "app", "--port", str(port),
        "--model", "sample:tiny_cnn", "--batch-size", "8", "--input-size", "64",
    ]  # fmt: skip
    log = (tmp_path / "app.log").open("w")
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_for_voila(process, url)
        yield url, tmp_path
    finally:
        stop(process, timeout=20)  # the launcher's own stop: Voila and its kernels end
        log.close()


def test_profile_sweep_slide_export_verify_in_chromium(start_playwright, app) -> None:
    url, workdir = app
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with start_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1100})
        try:
            page.goto(url, timeout=JOB_TIMEOUT_MS)
            page.wait_for_selector(".remat-pareto .js-plotly-plot", timeout=JOB_TIMEOUT_MS)
            page.click("button.remat-profile")
            page.wait_for_function(STATUS_HAS, arg="profiled", timeout=JOB_TIMEOUT_MS)
            page.wait_for_selector(".remat-timeline .js-plotly-plot", timeout=30_000)
            baseline = page.evaluate(PLOT_DATA, ".remat-timeline")[0]["y"]
            assert baseline, "the unmodified model's timeline is drawn after profiling"
            page.click("button.remat-sweep")
            page.wait_for_function(STATUS_HAS, arg="swept", timeout=JOB_TIMEOUT_MS)

            pareto = page.evaluate(PLOT_DATA, ".remat-pareto")
            front, selected = pareto[0], pareto[3]
            stops = len(front["x"])
            assert front["name"] == "front" and stops >= 2
            assert {"eager", "checkpoint per block"} <= {t["name"] for t in pareto[4:]}
            before = page.evaluate(PLOT_DATA, ".remat-timeline")[1]["y"]
            assert before, "the chosen schedule's timeline is drawn"

            handle = page.locator(".remat-budget .noUi-handle[role=slider]")
            # the slider is redrawn when its stops change: wait for the last redraw
            page.wait_for_function(
                "n => document.querySelector('.remat-budget .noUi-handle[role=slider]')"
                ".getAttribute('aria-valuemax') == n",
                arg=stops - 1,
                timeout=10_000,
            )
            index = round(float(handle.get_attribute("aria-valuenow")))
            assert selected["x"] == [front["x"][index]], "slider and highlight agree"
            step = 1 if index < stops - 1 else -1
            handle.focus()
            page.keyboard.press("ArrowRight" if step == 1 else "ArrowLeft")
            page.wait_for_function(SELECTED_AT, arg=front["x"][index + step], timeout=10_000)
            page.wait_for_function(TIMELINE_CHANGED, arg=before, timeout=10_000)

            page.click(".remat-export button")
            page.wait_for_function(STATUS_HAS, arg="exported to", timeout=30_000)
            written = re.search(r"exported to (\S+\.py)", page.inner_text(".remat-status"))
            path = Path(written.group(1))
            assert path.is_file() and path.parent == workdir.resolve()

            page.click(".remat-verify button")
            page.wait_for_function(STATUS_HAS, arg="verified", timeout=JOB_TIMEOUT_MS)
            assert "NOT" not in page.inner_text(".remat-status")
        finally:
            page.screenshot(path=str(OUTPUT / "dashboard.png"), full_page=True)
            browser.close()

    verified = subprocess.run(
        [sys.executable, "-m", "explorer.cli", "verify", str(path)],
        cwd=workdir, capture_output=True, text=True, timeout=600, env=_env(),
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
