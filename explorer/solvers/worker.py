"""A second process that re-decides windows beside this one, so a window search uses two cores.

A window run is Python writing a sub-model, then CBC solving it; both are single-threaded, so
on a machine with a second core two windows of different stages can be re-decided at once.
The worker is a fork of this process, made when a window search begins: it inherits the
StepMilp already built and under the search's objective, so nothing of the model is copied or
pickled, and it lives only as long as that search. Requests and answers (a start, the stages
to free, the windows found) are JSON over a pipe.

Fork is used only on Linux (macOS's system libraries are not fork-safe, Windows has none) and
only with a second core to run on; elsewhere windows run one at a time, with the same answers
per run. A worker that does not answer in time (a fork taken while another thread held a
lock the child then needs) is killed, and the search goes on alone.
"""

from __future__ import annotations

import gc
import json
import multiprocessing
import os
import signal
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from types import TracebackType

from explorer.solvers.milp import StepMilp
from explorer.solvers.space import Windows

GRACE_SECONDS = 5.0  # beyond a run's CBC limit, for writing its sub-model and reading back
STOP_SECONDS = 1.0  # a stopped child's time to unwind before it is killed
DISABLE = "REMAT_EXPLORER_SERIAL"  # set (to anything) to run windows one at a time


@contextmanager
def frozen() -> Iterator[None]:
    """Around a fork: the objects that exist are left out of the garbage collector's passes
    until it is done, so that a pass in the child does not write to every object it inherited
    (copying the parent's whole heap, page by page: the model, the graph, a dashboard's
    kernel). The child stays frozen: it only ever needs its own new objects collected."""
    parent = os.getpid()
    gc.freeze()
    try:
        yield
    finally:
        if os.getpid() == parent:
            gc.unfreeze()


def as_child() -> None:
    """In a forked child: Ctrl+C is the parent's to handle (the parent then ends the child;
    a traceback from here would reach the terminal), and SIGTERM unwinds the child, so that
    a CBC run it was in removes its temporary folder."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _unwind)


def _unwind(signum: int, frame: object) -> None:
    raise SystemExit(0)


def available() -> bool:
    """Whether a window search may fork a worker here (see the module docstring)."""
    if sys.platform != "linux" or os.environ.get(DISABLE):
        return False
    return len(os.sched_getaffinity(0)) >= 2


class WindowWorker:
    """One forked process running `StepMilp.run` on windows it is sent, one at a time.
    Use as a context manager: the process ends with the block."""

    def __init__(self, milp: StepMilp) -> None:
        milp.prepare_windows()  # inherited by the fork, not built again there
        context = multiprocessing.get_context("fork")
        self.conn, child = context.Pipe()
        with warnings.catch_warnings(), frozen():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            self.process = context.Process(
                target=_serve, args=(milp, child, self.conn), daemon=True
            )
            self.process.start()
        child.close()
        self.limit: float | None = None  # the CBC limit of the run in flight (None: idle)

    @classmethod
    def start(cls, milp: StepMilp) -> WindowWorker | None:
        """A worker for `milp`, or None where none may run (then windows run alone)."""
        if not available():
            return None
        try:
            return cls(milp)
        except (OSError, ValueError, AssertionError):  # no fork; a daemon may have no child
            return None

    def submit(self, start: Windows, free: range, reach: int | None, limit: float) -> None:
        """Re-decide the windows of stages `free` from `start` (answer with `result`)."""
        request = {"start": start, "free": [free.start, free.stop], "reach": reach}
        self.conn.send_bytes(json.dumps({**request, "limit": limit}).encode())
        self.limit = limit

    def result(self) -> Windows | None:
        """The windows the submitted run found (None: nothing, or the worker is gone)."""
        if self.limit is None:
            return None
        waited, self.limit = self.limit + GRACE_SECONDS, None
        try:
            if self.conn.poll(waited):
                return json.loads(self.conn.recv_bytes())["windows"]
        except (EOFError, OSError, ValueError, KeyError):
            pass
        self.close()  # hung or dead: the search goes on without it
        return None

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def close(self) -> None:
        """Ask the worker to end; one still running a window (a search cut short) is stopped."""
        if self.process.is_alive():
            try:
                self.conn.send_bytes(b"")
            except OSError:
                pass
            self.process.join(0.5)
        if self.process.is_alive():
            self.process.terminate()  # unwinds: its CBC run removes its temporary folder
            self.process.join(STOP_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()

    def __enter__(self) -> WindowWorker:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


def _serve(milp: StepMilp, conn: Connection, parents: Connection) -> None:
    """The worker's loop: run each request on its copy of the model until an empty one (or
    until the parent is gone: its end of the pipe, inherited here, is closed first so that
    the parent's exit reads as the end of the pipe)."""
    parents.close()
    as_child()
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            return  # the parent is gone
        if not request:
            return
        asked = json.loads(request)
        found = milp.run(
            asked["limit"], asked["start"], free=range(*asked["free"]), reach=asked["reach"]
        )
        try:
            conn.send_bytes(json.dumps({"windows": found.windows}).encode())
        except OSError:
            return  # the parent is gone
