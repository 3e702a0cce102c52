"""Progress reporting and cancellation shared by every long-running stage."""

from __future__ import annotations

import threading
from collections.abc import Callable

from explorer.errors import Cancelled

ProgressFn = Callable[[int, int, str], None]


class CancelToken:
    """A thread-safe flag: a dashboard sets it, the engine checks it between units of work."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def check_cancel(cancel: CancelToken | None) -> None:
    """Raise Cancelled if the token is set; called between units of work."""
    if cancel is not None and cancel.is_set():
        raise Cancelled("cancelled")


def report(progress: ProgressFn | None, done: int, total: int, message: str = "") -> None:
    """Call the progress callback if there is one."""
    if progress is not None:
        progress(done, total, message)
