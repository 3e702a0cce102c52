"""The solver's second process: windows re-decided two at a time (explorer.solvers.worker), and
a large step's least peak searched by a process that wrote the model during the setup
(explorer.solvers.background). Both need fork and a second core (Linux CI has them)."""

from __future__ import annotations

import gc
import os
from collections import defaultdict
from types import SimpleNamespace

import pytest
from helpers import planner
from ir_graphs import chain_step

from explorer import solve
from explorer.errors import Cancelled
from explorer.progress import CancelToken
from explorer.schedule import GraphSchedule
from explorer.solvers import background, worker
from explorer.solvers.milp import MilpResult
from explorer.solvers.refine import Refiner
from explorer.solvers.registry import make_solver

pytestmark = [
    pytest.mark.skipif(not worker.available(), reason="needs fork and two cores"),
    pytest.mark.serial,  # two processes on two cores: alone (scripts/test.sh)
]


@pytest.fixture(scope="module")
def cnn():
    plan = planner("sample:tiny_cnn", 4, 32)
    plan.profile()
    return plan.capture()[0], plan.profile().graphs[0]


def test_a_window_worker_answers_what_the_same_run_here_answers():
    # catches: a worker that runs another request than the one sent (stages, reach, start)
    # or whose answer is lost on the way back: its windows would be taken for the wrong ones
    graph, profile = chain_step([64] * 7)
    milp = make_solver("exact", graph, profile).milp
    milp.use_least_peak()
    start = milp.space.empty()
    free = range(1, milp.n)
    with worker.WindowWorker(milp) as other:
        other.submit(start, free, None, 10.0)
        theirs = other.result()
        assert other.process.pid != os.getpid()
    ours = milp.run(10.0, start, free=free, reach=None).windows
    assert theirs == ours and ours != start  # the run found something, the same there


class _TwoPlacesMilp:
    """A stand-in for StepMilp with 24 stages: a window over stage 0 finds that recomputing
    "a" there is faster, one over stage 12 that "b" there is; each only from a start that
    lacks it. Runs in a forked worker too (it is inherited)."""

    n = 24
    stages = list(range(24))
    budget = None
    seconds: dict[str, float] = {}

    def __init__(self) -> None:
        self.space = SimpleNamespace(windows_of=_windows_of, empty=lambda: [[] for _ in range(24)])
        self.starts: list[list[list[str]]] = []  # of the runs made here (not the worker's)
        self.ops_reads: defaultdict[str, tuple[str, ...]] = defaultdict(tuple)  # what each reads

    def use_budget(self, budget: int) -> None:
        pass

    def prepare_windows(self) -> None:
        pass

    def stage_highs(self, windows) -> list[float]:
        return [0.0] * self.n

    def run(self, time_limit, start=None, free=None, reach=None) -> MilpResult:
        self.starts.append(start)
        found = [list(w) for w in start]
        for stage, name in ((0, "a"), (12, "b")):
            if free is not None and stage in free and not found[stage]:
                found[stage] = [name]
        return MilpResult(None if found == start else found, None, None)


def _windows_of(schedule: GraphSchedule) -> list[list[str]]:
    windows: list[list[str]] = [[] for _ in range(24)]
    for entry in schedule.recomputed:
        stage, name = entry.split(":")
        windows[int(stage)].append(name)
    return windows


def test_two_windows_that_share_no_stage_run_at_once_and_both_answers_are_taken():
    # catches: the worker's answer dropped (only one window per round), windows sharing
    # stages sent together (their answers could not be joined), and two answers never joined
    # (each found alone, the second taken only after a whole new round)
    evaluated: list[list[str]] = []

    def evaluate(windows) -> GraphSchedule:
        names = [f"{t}:{a}" for t, w in enumerate(windows) for a in w]
        evaluated.append(names)
        found = GraphSchedule(fingerprint="f", saved=[], backward=[], recomputed=names)
        found.predicted_peak_bytes, found.predicted_seconds = 10, 3.0 - len(names)
        return found

    start_windows: list[list[str]] = [[] for _ in range(24)]
    start = evaluate(start_windows)
    evaluated.clear()
    milp = _TwoPlacesMilp()
    refined = Refiner(milp, evaluate, whole_runs=False, parallel=True).fastest(100, start, 30.0)
    assert evaluated[:3] == [["0:a"], ["12:b"], ["0:a", "12:b"]]
    assert refined.schedule.recomputed == ["0:a", "12:b"]
    # the first round ran the window over stage 0 here and the one over stage 12 there; every
    # later run started from both changes joined, none from "a" alone
    assert milp.starts[0] == start_windows
    assert all(_windows_of(refined.schedule) == s for s in milp.starts[1:])


def test_a_large_steps_least_peak_is_searched_by_the_process_that_wrote_its_model(cnn, monkeypatch):
    # catches: the background search's answers lost (the table's least peak kept), and the
    # model written here as well (the seconds the second process saves spent anyway)
    monkeypatch.setattr(solve, "MAX_WINDOWED_SIZE", 0)
    graph, profile = cnn
    table = make_solver("table", graph, profile).minimum()
    large = make_solver("chain", graph, profile, max_refine_size=0)
    assert large.least_only and large.background is not None
    lowest = large.minimum()
    assert lowest.predicted_peak_bytes < table.predicted_peak_bytes
    assert large.milp.prob is None  # written and searched in the other process only
    check = solve.evaluate(graph, profile, GraphSchedule.from_dict(lowest.to_dict()))
    assert check.predicted_peak_bytes == lowest.predicted_peak_bytes  # as simulated here


def test_a_background_search_that_fails_leaves_the_search_to_the_solver(cnn, monkeypatch):
    # catches: a dead second process taking the least-peak search down with it (the table's
    # least peak kept) or the solver waiting on it for ever
    def broken(milp, simulate, conn):
        raise RuntimeError("the child failed")

    monkeypatch.setattr(background, "_serve", broken)  # inherited by the fork
    monkeypatch.setattr(solve, "MAX_WINDOWED_SIZE", 0)
    graph, profile = cnn
    table = make_solver("table", graph, profile).minimum()
    large = make_solver("chain", graph, profile, max_refine_size=0)
    assert large.background is not None
    assert large.minimum().predicted_peak_bytes < table.predicted_peak_bytes
    assert large.milp.prob is not None  # searched here instead


def test_cancelling_or_dropping_a_solver_ends_its_background_process(cnn, monkeypatch):
    # catches: a cancelled search, or a solver never asked for its least peak, leaving its
    # second process running (a model written for nothing, memory held)
    monkeypatch.setattr(solve, "MAX_WINDOWED_SIZE", 0)
    graph, profile = cnn
    token = CancelToken()
    large = make_solver("chain", graph, profile, max_refine_size=0)
    pid = large.background.pid
    token.cancel()
    with pytest.raises(Cancelled), large.cancelled_by(token):
        large._least_of_large_step()
    assert not _running(pid)
    dropped = make_solver("chain", graph, profile, max_refine_size=0)
    pid = dropped.background.pid
    del dropped
    gc.collect()
    assert not _running(pid)


def _running(pid: int) -> bool:
    """Whether process `pid` exists (a reaped child does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
