"""The least-peak search of a step too large to refine every budget, in a process of its own
that starts before the solver's setup.

On such a step (resnet50 b8 128 px: 13,476 recomputation binaries) the search needs the
whole-step model, and PuLP writes it in 2.6 to 2.9 s, as long as the stage ILPs and the table
together; none of them needs another. So the solver forks this process as soon as it knows
the step's size: the child writes the model while the parent solves the stage ILPs and reads
the table, then receives the table's answers, searches (with a window worker of its own,
explorer.solvers.worker) and sends back every Pareto-optimal schedule it simulated. Requests
and answers are JSON over a pipe; the schedules come back simulated by the same code as the
parent's. The child builds nothing the parent needs afterwards: a step this large has no
other use for the model (its budgets are answered from the table and these schedules).

As for the window worker, only on Linux with a second core; elsewhere, or if the child does
not answer in time, the parent writes the model and searches itself.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from multiprocessing import Pipe
from multiprocessing.connection import Connection

from explorer.progress import CancelToken, check_cancel
from explorer.schedule import GraphSchedule
from explorer.solvers.answers import Answers
from explorer.solvers.milp import StepMilp
from explorer.solvers.refine import Refiner
from explorer.solvers.space import Windows
from explorer.solvers.worker import STOP_SECONDS, as_child, available, frozen

# Simulate the schedule of some windows, given the no-recompute step's seconds.
Simulate = Callable[[Windows, float], GraphSchedule]

BUILD_SECONDS = 300.0  # the most the parent waits for the child to write the model
GRACE_SECONDS = 10.0  # beyond the search's own seconds, for its last runs and the reply
POLL_SECONDS = 0.2  # how often the parent looks at its cancel token while it waits


def search_least_peak(
    refiner: Refiner, answers: Answers, lean_seconds: float, fastest_seconds: float
) -> None:
    """Lower the least peak of `answers` with windows for `lean_seconds`, then search the
    fastest schedule at the new least peak for `fastest_seconds`. The refiner should keep
    every schedule it takes in `answers`: one on the way down may be the best at another
    peak."""
    answers.add(refiner.leanest(answers.lowest(), lean_seconds).schedule)
    lowest = answers.lowest()
    budget = lowest.predicted_peak_bytes
    start = answers.best_within(budget) or lowest
    answers.add(refiner.fastest(budget, start, fastest_seconds, drop=True).schedule)


class BackgroundSearch:
    """The forked process of the module docstring: `search` once, then it ends."""

    def __init__(self, milp: StepMilp, simulate: Simulate) -> None:
        ours, theirs = Pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings(), frozen():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            pid = os.fork()
        if pid == 0:  # the child: never returns
            code = 1
            try:
                ours.close()
                as_child()
                _serve(milp, simulate, theirs)
                code = 0
            except BaseException:  # noqa: BLE001 (a failed search: the parent searches itself)
                pass
            finally:
                os._exit(code)
        theirs.close()
        self.pid, self.conn = pid, ours
        self._stop = weakref.finalize(self, _stop, pid, ours)

    @classmethod
    def start(cls, milp: StepMilp, simulate: Simulate) -> BackgroundSearch | None:
        """The process for `milp`, or None where none may run."""
        if not available():
            return None
        try:
            return cls(milp, simulate)
        except OSError:
            return None

    def search(
        self,
        baseline: GraphSchedule,
        lowest: GraphSchedule,
        seconds: tuple[float, float],
        cancel: CancelToken | None,
    ) -> tuple[list[GraphSchedule], float] | None:
        """`search_least_peak` from `lowest` (the least peak known), with `seconds` (the
        least peak's, the fastest schedule's): the Pareto set it ends with, and the seconds
        it searched; None if the child failed or hung (then it is stopped)."""
        request = {"baseline": baseline.to_dict(), "lowest": lowest.to_dict(), "seconds": seconds}
        try:
            if not self._wait(BUILD_SECONDS, cancel):  # the model is written
                return None
            self.conn.recv_bytes()
            self.conn.send_bytes(json.dumps(request).encode())
            if not self._wait(sum(seconds) + GRACE_SECONDS, cancel):
                return None
            reply = json.loads(self.conn.recv_bytes())
            return [GraphSchedule.from_dict(d) for d in reply["known"]], float(reply["seconds"])
        except (EOFError, OSError, ValueError, KeyError, TypeError):
            return None
        finally:
            self.close()

    def _wait(self, seconds: float, cancel: CancelToken | None) -> bool:
        """Wait up to `seconds` for the child's next message, looking at `cancel`."""
        deadline = time.perf_counter() + seconds
        while not self.conn.poll(POLL_SECONDS):
            check_cancel(cancel)  # Cancelled stops the child too (search's finally)
            if time.perf_counter() > deadline:
                return False
        return True

    def close(self) -> None:
        self._stop()


def _stop(pid: int, conn: Connection) -> None:
    """End the child (writing the model, waiting, or searching) and reap it: SIGTERM lets it
    unwind (its CBC runs remove their folders, its window worker is ended), SIGKILL follows
    if it has not ended within STOP_SECONDS."""
    conn.close()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.perf_counter() + STOP_SECONDS
        while time.perf_counter() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    return
            except ChildProcessError:
                return
            time.sleep(0.01)
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _serve(milp: StepMilp, simulate: Simulate, conn: Connection) -> None:
    """The child: write the model, say so, take the request, search, reply."""
    milp.prepare_windows()
    conn.send_bytes(b"built")
    asked = json.loads(conn.recv_bytes())
    started = time.perf_counter()
    baseline = GraphSchedule.from_dict(asked["baseline"])
    answers = Answers(baseline)
    answers.add(GraphSchedule.from_dict(asked["lowest"]))

    def simulated(windows: Windows) -> GraphSchedule:
        return simulate(windows, baseline.predicted_seconds)

    refiner = Refiner(
        milp, simulated, answers.add, whole_runs=False, parallel=True, follow_peak=True
    )
    lean_seconds, fastest_seconds = map(float, asked["seconds"])
    search_least_peak(refiner, answers, lean_seconds, fastest_seconds)
    reply = {
        "known": [s.to_dict() for s in answers.points],
        "seconds": time.perf_counter() - started,
    }
    conn.send_bytes(json.dumps(reply).encode())
