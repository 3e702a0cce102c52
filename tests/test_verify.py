"""verify: every row is a check that can fail, and the exported file is never run."""

from __future__ import annotations

import torch
from helpers import planner

import explorer
from explorer.verify import _peak_row, compare


def test_a_missing_gradient_fails_its_row():
    a = torch.ones(3)
    row = compare("parameter gradients", [(a, a.clone()), (a, None)])
    assert not row.ok and "#1 missing in the schedule" in row.note
    row = compare("outputs", [(None, a)])
    assert not row.ok and "missing in the reference" in row.note
    assert compare("outputs", [(a, a.clone())]).ok
    assert not compare("outputs", []).ok  # nothing compared is not a pass


def test_a_different_gradient_fails_its_row():
    a = torch.ones(3)
    assert not compare("g", [(a, a + 1e-3)]).ok
    close = compare("g", [(a, a + 1e-7)])
    assert close.ok and close.measured.startswith("max |diff|")
    assert not compare("g", [(a, torch.ones(4))]).ok
    assert not compare(
        "g", [(torch.ones(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64))]
    ).ok


def test_peak_row_can_fail():
    schedule = {"predicted_peak_bytes": 1000, "budget_bytes": 1010}
    assert _peak_row(1000, schedule).ok
    assert not _peak_row(1011, schedule).ok  # over the budget
    assert not _peak_row(900, {"predicted_peak_bytes": 1000, "budget_bytes": None}).ok  # -10%


def test_verify_never_runs_the_file(tmp_path):
    plan = planner("sample:tiny_mlp", 4, None)
    path = plan.baseline().export(tmp_path / "mlp.py")
    marker = tmp_path / "ran"
    text = path.read_text()
    path.write_text(f"open({str(marker)!r}, 'w').close()\n" + text)
    report = explorer.verify(path, model=plan.model, example_inputs=plan.example_inputs)
    assert report.ok, report.format_table()
    assert not marker.exists()
