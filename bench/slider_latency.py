"""How long the Pareto plot and the timeline take to follow a budget-slider move (target 200 ms).

Two measurements per model, after one sweep:

- kernel: moving `BudgetSlider` to each stop in the Python process, until the highlighted
  point and the timeline are updated and serialized for the page (the first visit of a stop
  simulates its timeline; later visits reuse it);
- browser (with --browser): `remat-explorer app` in headless Chromium, an ArrowRight on the
  slider handle until the page's plotly data shows the new point and timeline: the whole
  round trip a user waits for.

    python bench/slider_latency.py [--browser] [--models sample:tiny_cnn:8:64 resnet18:8:224]

Prints a table and writes bench/results/slider_latency.json.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from remat_explorer.widgets import Dashboard  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "slider_latency.json"
TARGET_MS = 200.0
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
DEFAULT_MODELS = ["sample:tiny_cnn:8:64", "resnet18:8:224"]
SWEEP_POINTS = 12
KERNEL_MOVES = 40
BROWSER_MOVES = 10
TIMEOUT_MS = 10_000

# Installed before a key press: resolves with the ms from the keydown until the page's plots
# hold a new selected point and a new schedule timeline (or with the timeout, shown as SLOW).
WATCH_JS = """timeout => {
    const data = sel => document.querySelector(sel + ' .js-plotly-plot').data;
    const key = () => JSON.stringify([data('.remat-pareto')[3].x, data('.remat-timeline')[1].y]);
    const before = key();
    window.__latency = new Promise(resolve => {
        setTimeout(() => resolve(timeout), timeout);
        document.addEventListener('keydown', () => {
            const start = performance.now();
            const poll = () => key() !== before
                ? resolve(performance.now() - start) : requestAnimationFrame(poll);
            poll();
        }, {once: true, capture: true});
    });
}"""


def parse_model(text: str) -> tuple[str, int, int]:
    """'resnet18:8:64' -> ('resnet18', 8, 64); a sample SPEC keeps its own colon."""
    spec, batch, size = text.rsplit(":", 2)
    return spec, int(batch), int(size)


def kernel_latency(spec: str, batch: int, size: int) -> dict:
    """Slider moves in this process: ms per move, first visits and revisits apart."""
    dashboard = Dashboard(spec=spec, batch_size=batch, input_size=size, points=SWEEP_POINTS,
                          peers=False)  # fmt: skip
    started = time.perf_counter()
    dashboard.sweep()
    if not dashboard.wait(1800) or dashboard.status.kind != "ok":
        raise SystemExit(f"{spec}: sweep failed: {dashboard.status.text}")
    sweep_s = time.perf_counter() - started
    stops = len(dashboard.budget.choices)
    if stops < 2:
        raise SystemExit(f"{spec}: the front has {stops} point(s); nothing to slide between")
    visited = {dashboard.budget.slider.value}
    first, again = [], []
    for index in _back_and_forth(stops, KERNEL_MOVES):
        began = time.perf_counter()
        dashboard.budget.slider.value = index
        elapsed = (time.perf_counter() - began) * 1000
        (again if index in visited else first).append(elapsed)
        visited.add(index)
    return {"stops": stops, "sweep_s": sweep_s, "first_ms": first, "again_ms": again}


def _back_and_forth(stops: int, moves: int) -> list[int]:
    """Stop indexes one step apart, from 0 to the end and back, as the arrow keys move."""
    cycle = [*range(1, stops), *range(stops - 2, -1, -1)]
    return [cycle[i % len(cycle)] for i in range(moves)]


def browser_latency(spec: str, batch: int, size: int) -> dict:
    """ArrowRight / ArrowLeft on the slider handle in Chromium: ms until both plots changed."""
    from playwright.sync_api import sync_playwright

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    command = [sys.executable, "-m", "explorer.cli", "app", "--port", str(port), "--model", spec,
               "--batch-size", str(batch), "--input-size", str(size)]  # fmt: skip
    app = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/"
    try:
        _wait_for(url + "voila/static/voila.js", app)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url, timeout=600_000)
            page.wait_for_selector(".remat-pareto .js-plotly-plot", timeout=600_000)
            page.click("button.remat-sweep")
            status = "document.querySelector('.remat-status').innerText.includes('swept')"
            page.wait_for_function(status, timeout=1_800_000, polling=500)
            stops = len(page.evaluate(
                "document.querySelector('.remat-pareto .js-plotly-plot').data[0].x"
            ))  # fmt: skip
            if stops < 2:
                raise SystemExit(f"{spec}: the front has {stops} point(s); nothing to slide")
            handle = page.locator(".remat-budget .noUi-handle[role=slider]")
            times, step = [], 1
            for _ in range(BROWSER_MOVES):
                position = round(float(handle.get_attribute("aria-valuenow")))
                if not 0 <= position + step < stops:
                    step = -step  # bounce at either end, as _back_and_forth does
                handle.focus()  # as a user clicks it: a redrawn slider loses the focus
                page.evaluate(WATCH_JS, TIMEOUT_MS)
                page.keyboard.press("ArrowRight" if step > 0 else "ArrowLeft")
                times.append(page.evaluate("window.__latency"))
            browser.close()
        return {"stops": stops, "ms": times}
    finally:
        app.terminate()
        app.wait(timeout=30)


def _wait_for(url: str, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the app exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"no answer from {url}")


def _row(name: str, label: str, ms: list[float]) -> str:
    verdict = "ok" if max(ms) < TARGET_MS else "SLOW"
    return (f"{name:<22} {label:<22} {len(ms):>5} {statistics.median(ms):>9.1f} "
            f"{max(ms):>9.1f}  {verdict}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS, help="SPEC:BATCH:SIZE")
    parser.add_argument("--browser", action="store_true", help="also measure in Chromium")
    args = parser.parse_args()
    torch.set_num_threads(1)

    results = {"target_ms": TARGET_MS, "torch_threads": 1, "models": {}}
    print(f"{'model':<22} {'measure':<22} {'moves':>5} {'median ms':>9} {'max ms':>9}")
    for text in args.models:
        spec, batch, size = parse_model(text)
        entry = {"kernel": kernel_latency(spec, batch, size)}
        kernel = entry["kernel"]
        print(_row(text, "kernel, first visit", kernel["first_ms"]))
        print(_row(text, "kernel, revisit", kernel["again_ms"]))
        if args.browser:
            entry["browser"] = browser_latency(spec, batch, size)
            print(_row(text, "browser, key to drawn", entry["browser"]["ms"]))
        results["models"][text] = entry
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
