"""Long work (profile, sweep, solve, verify) off the kernel's main thread, one job at a time.

The kernel must stay free to receive widget events (the Cancel click, slider moves) while a
sweep runs, so jobs run in a worker thread. Widgets, though, must only change on the
kernel's main thread: while it applies a message from the page to a widget it holds that
widget's trait notifications, and a change made meanwhile from another thread is merged
away (a plotly FigureWidget then silently misses an update). So the worker hands every
widget update to the main thread's event loop with `TaskRunner.ui`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ipywidgets as ipw
import traitlets

from explorer import Cancelled, CancelToken, UserError
from explorer.threads import install_fake_cuda_guard_here
from remat_explorer.widgets.status import StatusLine

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, str], None]
Work = Callable[[ProgressFn, CancelToken], Any]

PROGRESS_INTERVAL_S = 0.1


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The kernel's event loop when created inside a kernel; None in a plain script or test."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


class TaskRunner(traitlets.HasTraits):
    """Runs one job at a time in a thread, with a progress bar, a Cancel button and a status.

    `busy` is a trait so buttons can disable themselves while a job runs. Errors end the job
    with one line in the status (a `UserError`'s own message; anything else its type and
    message, the traceback going to the log), never a traceback on the page.

    Create it on the thread that owns the widgets (a notebook cell does). Without an event
    loop there (scripts, tests) widget updates run directly in the worker, so after `wait()`
    everything is drawn; in a kernel they run on its loop shortly after. That thread outlives
    the jobs' threads, so what tracing needs installed for the whole process is installed
    from it (`explorer.threads`).
    """

    busy = traitlets.Bool(False)

    def __init__(self, status: StatusLine | None = None) -> None:
        super().__init__()
        self.status = status or StatusLine()
        self.progress = ipw.IntProgress(value=0, min=0, max=1, description="")
        self.progress.add_class("remat-progress")
        self.cancel_button = ipw.Button(description="Cancel", icon="stop", disabled=True)
        self.cancel_button.add_class("remat-cancel")
        self.cancel_button.on_click(lambda _: self.cancel())
        self._loop = _running_loop()
        self._owner = threading.current_thread()
        install_fake_cuda_guard_here()
        self._token: CancelToken | None = None
        self._thread: threading.Thread | None = None
        self._last_report = 0.0

    def start(
        self,
        name: str,
        work: Work,
        done: Callable[[Any], None] | None = None,
    ) -> bool:
        """Start `work(progress, cancel)` in a thread, then `done(result)` as a widget update.

        Returns False (and says so in the status) when another job is still running.
        """
        if self.busy:
            self.status.error(f"wait for the running job to finish (or cancel it) before {name}")
            return False
        self._token = CancelToken()
        self.busy = True
        self.progress.value = 0
        self.progress.description = name
        self.cancel_button.disabled = False  # every job looks at its token
        self.status.info(f"{name} ...")
        self._thread = threading.Thread(
            target=self._run,
            args=(name, work, done, self._token),
            name=f"remat-{name}",
            daemon=True,
        )
        self._thread.start()
        return True

    def ui(self, update: Callable[..., None], *args: Any) -> None:
        """Run `update(*args)` where widgets may change: the main thread, in order.

        From the worker inside a kernel it is queued on the kernel's loop (its errors then
        go to the status line); anywhere else it runs at once.
        """
        if self._loop is None or threading.current_thread() is self._owner:
            update(*args)
        else:
            self._loop.call_soon_threadsafe(self.status.guard(update), *args)

    def cancel(self) -> None:
        """Ask the running job to stop; the engine checks the token between units of work."""
        if self._token is not None:
            self._token.cancel()
            self.status.info("cancelling ...")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the current job ends (scripts, tests, benchmarks); True if it did."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def report(self, done: int, total: int, message: str) -> None:
        """A `ProgressFn`: moves the bar; throttled, since each update is a message to the page."""
        now = time.monotonic()
        if done < total and now - self._last_report < PROGRESS_INTERVAL_S:
            return
        self._last_report = now
        self.ui(self._show_progress, done, total, message)

    def _show_progress(self, done: int, total: int, message: str) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = min(done, self.progress.max)
        if message:
            self.status.info(f"{self.progress.description}: {message}")

    def _run(
        self, name: str, work: Work, done: Callable[[Any], None] | None, token: CancelToken
    ) -> None:
        try:
            result = work(self.report, token)
            self.ui(self._succeeded, name, done, result)
        except Cancelled:
            self.ui(self.status.info, f"{name} cancelled")
        except UserError as error:
            self.ui(self.status.error, str(error))
        except Exception as error:  # any other failure: one line here, the traceback in the log
            log.exception("%s failed", name)
            self.ui(self.status.error, f"{name} failed: {type(error).__name__}: {error}")
        finally:
            self.ui(self._finished)

    def _succeeded(self, name: str, done: Callable[[Any], None] | None, result: Any) -> None:
        self.progress.value = self.progress.max
        self.status.ok(f"{name} done")
        if done is not None:
            done(result)

    def _finished(self) -> None:
        self.cancel_button.disabled = True
        self.busy = False
