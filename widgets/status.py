"""The status line: the one place the dashboard reports progress messages and errors."""

from __future__ import annotations

import functools
import html
import logging
from collections.abc import Callable
from typing import Any

import ipywidgets as ipw

from explorer import UserError

log = logging.getLogger(__name__)

COLOURS = {"info": "#444", "ok": "#1a7f37", "error": "#b42318"}


class StatusLine(ipw.HTML):
    """One line of text (class `remat-status`); errors show their message, never a traceback.

    Callbacks run where their output is invisible (button handlers, worker threads), so every
    component reports here instead of printing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.add_class("remat-status")
        self.text = ""
        self.kind = "info"

    def show(self, text: str, kind: str = "info") -> None:
        """Show `text` (first line only: a multi-line message is a traceback in disguise)."""
        lines = str(text).strip().splitlines()
        self.text = lines[0] if lines else ""
        self.kind = kind
        self.value = (
            f'<span class="remat-status-{kind}" style="color:{COLOURS[kind]}">'
            f"{html.escape(self.text)}</span>"
        )

    def info(self, text: str) -> None:
        self.show(text, "info")

    def ok(self, text: str) -> None:
        self.show(text, "ok")

    def error(self, text: str) -> None:
        self.show(text, "error")

    def guard(self, callback: Callable[..., None]) -> Callable[..., None]:
        """Wrap a widget callback so its errors land here: ipywidgets would only log them."""

        @functools.wraps(callback)
        def guarded(*args: Any) -> None:
            try:
                callback(*args)
            except UserError as error:
                self.error(str(error))
            except Exception as error:  # any other failure: one line here, the traceback logged
                log.exception("widget callback failed")
                self.error(f"{type(error).__name__}: {error}")

        return guarded
