"""The Voila notebook runs headless in a real kernel and produces the dashboard's widgets."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from remat_explorer.apps.launch import (
    ENV_BATCH_SIZE,
    ENV_EXPORT_DIR,
    ENV_INPUT_SIZE,
    ENV_MODEL,
    NOTEBOOK,
)

ROOT = Path(__file__).resolve().parent.parent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
CLASSES = {
    "remat-model", "remat-profile", "remat-sweep", "remat-cancel", "remat-progress",
    "remat-pareto", "remat-budget", "remat-timeline", "remat-export", "remat-verify",
    "remat-status",
}  # fmt: skip


def test_dashboard_notebook_executes_and_renders_its_widgets(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ENV_MODEL, "sample:tiny_cnn")
    monkeypatch.setenv(ENV_BATCH_SIZE, "4")
    monkeypatch.setenv(ENV_INPUT_SIZE, "16")
    monkeypatch.setenv(ENV_EXPORT_DIR, str(tmp_path))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook, timeout=300, kernel_name="python3", allow_errors=False,
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )  # fmt: skip
    client.execute()

    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    views = [o.data[WIDGET_VIEW] for o in outputs if WIDGET_VIEW in o.get("data", {})]
    assert len(views) == 1, "the notebook shows exactly one widget: the dashboard"

    state = notebook.metadata.widgets[WIDGET_STATE]["state"]
    root = state[views[0]["model_id"]]["state"]
    assert "remat-dashboard" in root["_dom_classes"]
    classes = {c for model in state.values() for c in model["state"].get("_dom_classes", ())}
    assert CLASSES <= classes
    picker = [m["state"] for m in state.values() if m["model_name"] == "ComboboxModel"]
    assert [p["value"] for p in picker] == ["sample:tiny_cnn"]
    figures = [m for m in state.values() if "_widget_data" in m["state"]]
    assert len(figures) == 1, "the Pareto plot is drawn; the timeline waits for a profile"
