"""Chart `bench/front.py` results: our front beside PyTorch's tools, one figure per model.

    python bench/chart.py [bench/results/front_*.json ...] [--docs docs] [--no-png]

For each results file, one plotly figure: x is the measured peak memory of a whole training
step (MiB), y the step time over eager's (median of the interleaved rounds). Our front's
predicted points are a line, our measured points markers (a faint dotted segment joins
each to its prediction), and each of PyTorch's tools (eager, checkpoint per block,
checkpoint_sequential, torch.compile at each activation_memory_budget) a labelled marker of
its own. Writes one <docs>/fronts.html with every figure, and
<docs>/front_<model>_b<batch>_s<size>.png for each.

The HTML carries plotly.js once (about 4.8 MB) so that it opens offline and on its own; "cdn"
would need the network, and a file per model would repeat plotly.js in each. Each PNG is a
screenshot of that figure alone, in a temporary HTML file, in headless Chromium (Python
playwright driving the system's `chromium`; nothing downloaded, kaleido not needed); without
them, HTML only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import plotly.graph_objects as go

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = ROOT / "docs"
MIB = 2**20
WIDTH, HEIGHT = 1100, 620
CHROMIUM_ARGS = ["--no-sandbox", "--headless=new", "--disable-gpu"]

# marker, colour and where the label goes, by family; a new family falls back to "other"
STYLES: dict[str, dict[str, Any]] = {
    "eager": {"symbol": "circle", "color": "#222222", "text": "top left"},
    "checkpoint": {"symbol": "square", "color": "#d62728", "text": "top center"},
    "torch.compile": {"symbol": "triangle-up", "color": "#2ca02c", "text": "top right"},
    "remat-explorer": {"symbol": "diamond", "color": "#1f77b4", "text": "bottom right"},
    "other": {"symbol": "x", "color": "#7f7f7f", "text": "top center"},
}


def load(path: Path) -> dict:
    """A results file, with rows in the current form (files written before the side-by-side
    bench name the measured peak and overhead differently and have no families)."""
    data = json.loads(path.read_text())
    for row in data.get("measured", []):
        row.setdefault("name", f"remat-explorer point {row.get('point')}")
        row.setdefault("family", "remat-explorer")
        row.setdefault("peak_bytes", row.get("measured_peak_bytes"))
        row.setdefault("overhead", row.get("measured_overhead"))
    for row in data.get("peers", []):
        if "family" not in row:
            row["family"] = "eager" if row["name"] == "eager" else "checkpoint"
    for row in [*data.get("measured", []), *data.get("peers", [])]:
        row.setdefault("time_ratio", 1 + row["overhead"] if row.get("overhead") else 1.0)
    return data


def stem(data: dict) -> str:
    """front_<model>_b<batch>_s<size>, as bench/front.py names its results."""
    model = str(data["model"]).replace(":", "_")
    return f"front_{model}_b{data['batch_size']}_s{data['input_size']}"


def _measured(row: dict) -> bool:
    """Whether the row has a peak and a time (a peer that could not run has neither)."""
    ratio = row.get("time_ratio")
    return bool(row.get("peak_bytes")) and ratio is not None and ratio == ratio


def _label(row: dict) -> str:
    """A short marker label: 'point 3', 'budget 0.5', 'eager', 'checkpoint_sequential'."""
    if row["family"] == "remat-explorer":
        return f"point {row.get('point')}"
    if row["family"] == "torch.compile":
        return f"compile {row.get('activation_memory_budget', '?'):g}"
    return row["name"]


def _hover(row: dict) -> str:
    """Hover text for a measured marker."""
    lines = [
        f"<b>{row['name']}</b>",
        f"peak {row['peak_bytes'] / MIB:.1f} MiB, time x{row['time_ratio']:.3f}",
    ]
    if "predicted_peak_bytes" in row:
        lines.append(
            f"predicted {row['predicted_peak_bytes'] / MIB:.1f} MiB, "
            f"x{1 + row['predicted_overhead']:.3f}"
        )
    if row.get("detail"):
        lines.append(str(row["detail"]))
    return "<br>".join(lines)


def figure(data: dict) -> go.Figure:
    """One model's chart (module docstring)."""
    fig = go.Figure()
    front = sorted(enumerate(data["front"]), key=lambda kp: kp[1]["predicted_peak_bytes"])
    fig.add_trace(
        go.Scatter(
            x=[p["predicted_peak_bytes"] / MIB for _, p in front],
            y=[1 + p["predicted_overhead"] for _, p in front],
            mode="lines+markers",
            name="remat-explorer front (predicted)",
            line={"color": STYLES["remat-explorer"]["color"], "width": 2},
            marker={"size": 5},
            hovertext=[
                f"predicted point {k}: {p['predicted_peak_bytes'] / MIB:.1f} MiB, "
                f"x{1 + p['predicted_overhead']:.3f}"
                for k, p in front
            ],
            hoverinfo="text",
        )
    )
    ours = [r for r in data.get("measured", []) if _measured(r)]
    for row in ours:  # predicted to measured, faint: how far each prediction was off
        if "predicted_peak_bytes" in row:
            fig.add_trace(
                go.Scatter(
                    x=[row["predicted_peak_bytes"] / MIB, row["peak_bytes"] / MIB],
                    y=[1 + row["predicted_overhead"], row["time_ratio"]],
                    mode="lines",
                    line={"color": STYLES["remat-explorer"]["color"], "width": 1, "dash": "dot"},
                    opacity=0.5,
                    showlegend=False,
                    hoverinfo="skip",
                )
            )
    if ours:
        fig.add_trace(_markers("remat-explorer (measured)", "remat-explorer", ours))
    for row in data.get("peers", []):
        if _measured(row):
            fig.add_trace(_markers(row["name"], row["family"], [row]))
    fixed = data.get("fixed_bytes")
    if fixed:
        fig.add_vline(
            x=fixed / MIB,
            line={"dash": "dot", "color": "#999999", "width": 1},
            annotation_text="parameters, buffers, inputs, gradients",
            annotation_position="top right",
            annotation_font={"size": 10, "color": "#777777"},
        )
    xs = [x for trace in fig.data for x in trace.x] + ([fixed / MIB] if fixed else [])
    span = max(max(xs) - min(xs), 1e-9)
    fig.update_xaxes(range=[min(xs) - 0.04 * span, max(xs) + 0.1 * span])  # room for labels
    notes = _notes(data)
    fig.update_layout(
        title={"text": _title(data), "x": 0.01, "xanchor": "left"},
        xaxis_title="measured peak memory of a training step (MiB)",
        yaxis_title=f"step time / eager (median of {data.get('repeats', '?')} rounds)",
        width=WIDTH,
        height=HEIGHT,
        template="plotly_white",
        margin={"l": 70, "r": 250, "t": 90, "b": 75 + 15 * len(notes)},
        legend={"x": 1.02, "y": 1, "xanchor": "left", "yanchor": "top", "font": {"size": 11}},
    )
    if notes:
        fig.add_annotation(
            text="<br>".join(notes),
            xref="paper",
            yref="paper",
            x=0,
            y=0,
            yshift=-55,
            showarrow=False,
            align="left",
            xanchor="left",
            yanchor="top",
            font={"size": 10, "color": "#666666"},
        )
    return fig


def _markers(name: str, family: str, rows: list[dict]) -> go.Scatter:
    style = STYLES.get(family, STYLES["other"])
    return go.Scatter(
        x=[r["peak_bytes"] / MIB for r in rows],
        y=[r["time_ratio"] for r in rows],
        mode="markers+text",
        name=name,
        text=[_label(r) for r in rows],
        textposition=style["text"],
        textfont={"size": 10, "color": style["color"]},
        marker={
            "symbol": style["symbol"],
            "color": style["color"],
            "size": 11,
            "line": {"width": 1, "color": "white"},
        },
        hovertext=[_hover(r) for r in rows],
        hoverinfo="text",
    )


def _title(data: dict) -> str:
    head = f"{data['model']}, batch {data['batch_size']}, input size {data.get('input_size')}"
    sub = f"{data.get('device', '?')}, torch {data.get('torch', '?')}"
    if data.get("compile_backend"):
        sub += f", torch.compile backend {data['compile_backend']}"
    return f"{head}<br><span style='font-size:12px;color:#666'>{sub}</span>"


def _notes(data: dict) -> list[str]:
    """Footnote lines: the meter, and the peers that were skipped and why."""
    lines = []
    if data.get("meter"):
        lines.append(f"memory: {data['meter']}")
    skipped = data.get("skipped") or [
        {"name": r["name"], "detail": r.get("detail", "")}
        for r in data.get("peers", [])
        if not _measured(r)
    ]
    for s in skipped:
        lines.append(f"{s['name']}: skipped ({s['detail']})")
    return lines


def write_png(html: Path, png: Path) -> bool:
    """Screenshot the chart in `html` into `png` with headless Chromium; False if there is
    no playwright or no chromium here."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        chromium = None
    if chromium is None:
        return False
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(
                viewport={"width": WIDTH + 40, "height": HEIGHT + 40}, device_scale_factor=2
            )
            page.goto(html.resolve().as_uri())
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
            page.add_style_tag(content=".modebar-container { display: none !important; }")
            page.locator(".js-plotly-plot").first.screenshot(path=str(png))
        finally:
            browser.close()
    return True


def main() -> None:
    """Parse the command line and write each results file's HTML and PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "results", nargs="*", type=Path, help="results files (default: bench/results/front_*)"
    )
    parser.add_argument("--docs", type=Path, default=DOCS, help="folder for HTML and PNG")
    parser.add_argument("--no-png", action="store_true", help="write the HTML only")
    args = parser.parse_args()
    paths = args.results or sorted(RESULTS.glob("front_*.json"))
    if not paths:
        parser.error(f"no results: run bench/front.py first (looked in {RESULTS})")
    args.docs.mkdir(parents=True, exist_ok=True)
    charts = [(stem(data), figure(data)) for data in map(load, paths)]
    html = args.docs / "fronts.html"
    parts = [
        fig.to_html(include_plotlyjs=k == 0, full_html=False, div_id=name)
        for k, (name, fig) in enumerate(charts)
    ]
    html.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>remat-explorer fronts</title>"
        "</head><body>" + "\n".join(parts) + "</body></html>\n"
    )
    print(f"wrote {html}")
    if args.no_png:
        return
    with tempfile.TemporaryDirectory() as folder:
        for name, fig in charts:
            alone = Path(folder) / f"{name}.html"
            fig.write_html(alone, include_plotlyjs=True, full_html=True)
            png = args.docs / f"{name}.png"
            if not write_png(alone, png):
                print("no PNG: needs Python playwright and a chromium on PATH")
                return
            print(f"wrote {png}")


if __name__ == "__main__":
    main()
