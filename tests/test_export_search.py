"""`export --search`: a front's budget solved by itself from the files the sweep wrote
(explorer.frontsearch), where the front's own point within it is slower."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from explorer.cli import main
from explorer.export import read_module
from explorer.schedule import Schedule
from explorer.sweep import Front
from tests.test_cli import assert_refused, cli, export_args, run

# just under no recomputation: a two-point front's point within it keeps far less (its least
# peak, or the table's answer added between), while the budget solved by itself recomputes
# a little, and so costs less
BUDGET = "0.95"


def _swept(out: Path, *extra: str) -> Path:
    """A two-point front of the chain table's answers: a budget between its points gets the
    least peak's schedule from the front, and a faster one when solved by itself."""
    args = ["sweep", "--points", "2", "--solver", "table", "--out", str(out), *extra]
    assert main(args) == 0
    return out / "front.json"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny_search")
    return _swept(out, "--model", "sample:tiny_cnn", "--batch-size", "8", "--input-size", "32")


def _overheads(front_path: Path, target: Path, budget: str = BUDGET) -> tuple[float, float]:
    """The front's point within `budget` and the exported file's, as predicted overheads."""
    swept = Front.load(front_path).at_budget(budget).predicted_overhead
    return swept, Schedule.from_dict(read_module(target)[1]).predicted_overhead


def test_a_budget_between_two_points_is_solved_by_itself_and_verifies(capsys, tiny, tmp_path):
    # catches: --search returning the front's point (the least peak's, slower), or writing a
    # file whose MADE_FOR is not the step it was solved for, so that verify refuses or
    # measures another peak
    target = tmp_path / "searched.py"
    code, err = run(capsys, *export_args(tiny, target, "--search", budget=BUDGET))
    assert code == 0, err
    assert any(line.startswith("searched in") for line in err), err
    swept, searched = _overheads(tiny, target)
    assert searched < swept
    assert read_module(target)[0]["fingerprints"] == [Front.load(tiny).fingerprint]
    verified = cli("verify", str(target), "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    peak = next(r for r in json.loads(verified.stdout)["rows"] if r["quantity"].startswith("peak"))
    assert peak["measured"] == peak["predicted"]


def test_a_front_planned_for_another_device_is_searched_with_its_cost_model(capsys, tmp_path):
    # catches: a --plan-for front (no profile.json beside it) refused, or searched with the
    # times of this machine rather than the device it was planned for
    front = _swept(tmp_path, "--model", "sample:tiny_cnn", "--batch-size", "64",
                   "--input-size", "32", "--plan-for", "p100")  # fmt: skip
    assert json.loads(front.read_text())["setup"]["plan_for"] == "p100"
    target = tmp_path / "for_p100.py"
    code, err = run(capsys, *export_args(front, target, "--search", budget="0.7"))
    assert code == 0, err
    swept, searched = _overheads(front, target, "0.7")
    assert searched < swept
    made_for = read_module(target)[0]
    assert made_for["device"] == "cuda" and made_for["model"]["batch_size"] == 64


def _without_profile(folder: Path) -> None:
    (folder / "profile.json").unlink()


def _edited(**changes):
    def edit(folder: Path) -> None:
        path = folder / "front.json"
        data = json.loads(path.read_text())
        for key, value in changes.items():
            data[key] = value(data[key])
        path.write_text(json.dumps(data))

    return edit


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_without_profile, "profile.json is missing"),
        (  # the model traces to another graph than the one swept
            _edited(model=lambda m: {**m, "model": {**m["model"], "batch_size": 4}}),
            "sweep it again",
        ),
        (
            _edited(model=lambda m: {**m, "model": {**m["model"], "buildable": False}}),
            "without a SPEC",
        ),
        (_edited(setup=lambda s: {**s, "time_limit": "5"}), "not a number of seconds"),
    ],
)
def test_what_cannot_be_searched_again_is_refused_in_one_line(
    capsys, tiny, tmp_path, damage, expected
):
    # catches: a search that silently solves another step (the model changed since the
    # sweep), or fails with a traceback where the sweep's files are missing
    folder = tmp_path / "front"
    shutil.copytree(tiny.parent, folder)
    damage(folder)
    target = tmp_path / "never.py"
    assert_refused(
        capsys, export_args(folder / "front.json", target, "--search", budget=BUDGET), expected
    )
    assert not target.exists()


@pytest.mark.parametrize(
    ("out", "budget", "expected"),
    [
        ("never.py", "0.01", "below the front's minimum"),
        ("half0.5.py", BUDGET, "must be a Python module name"),
    ],
)
def test_what_export_refuses_is_refused_before_any_work(
    capsys, monkeypatch, tiny, tmp_path, out, budget, expected
):
    # catches: a budget or a file name export refuses found out after the model was built,
    # traced and solved (tens of seconds on a large step), under a progress line
    from explorer import frontsearch

    monkeypatch.setattr(frontsearch, "planner_of", lambda *a: pytest.fail("built the model"))
    target = tmp_path / out
    assert_refused(capsys, export_args(tiny, target, "--search", budget=budget), expected)
    assert not target.exists()


def test_a_budget_the_front_meets_is_written_if_the_search_refuses_it(
    capsys, monkeypatch, tiny, tmp_path
):
    # catches: a solver made without the sweep's cache (whose least peak it does not know)
    # refusing a budget the front meets, as under its own minimum
    from explorer.planner import Planner
    from explorer.units import below_minimum

    def refuse(plan, budget, *args):
        raise below_minimum(1, 2, "the solver's minimum", 3, 0)

    monkeypatch.setattr(Planner, "solve", refuse)
    target = tmp_path / "front_point.py"
    code, err = run(capsys, *export_args(tiny, target, "--search", budget=BUDGET))
    assert code == 0, err
    swept, written = _overheads(tiny, target)
    assert written == swept


def test_a_slower_search_writes_the_fronts_point(capsys, monkeypatch, tiny, tmp_path):
    # catches: --search trusting the search over the sweep; here the search is made to answer
    # the least peak's budget, slower than the front's point within BUDGET
    from explorer.planner import Planner

    least = min(p.predicted_peak_bytes for p in Front.load(tiny).points)
    solve = Planner.solve
    monkeypatch.setattr(Planner, "solve", lambda plan, _budget, *a: solve(plan, least, *a))
    target = tmp_path / "front_point.py"
    code, err = run(capsys, *export_args(tiny, target, "--search", budget=BUDGET))
    assert code == 0, err
    assert any("nothing faster than the front's point" in line for line in err), err
    swept, written = _overheads(tiny, target)
    assert written == swept
