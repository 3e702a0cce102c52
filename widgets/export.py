"""The export panel: write the chosen schedule as a Python module and say where it went."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as ipw

from explorer import UserError
from remat_explorer.widgets.status import StatusLine

Listener = Callable[[Path], None]


def module_file_name(model_name: str, peak_bytes: int, directory: str | Path = ".") -> str:
    """'sample:tiny_cnn' at 2.77 MiB -> 'tiny_cnn_2p77MiB.py': a name `import` accepts.

    The peak has three significant digits, so neighbouring points get different names; a
    name already taken in `directory` gets a counter (`_2`, `_3`, ...).
    """
    stem = re.sub(r"\W+", "_", model_name.split(":")[-1]).strip("_") or "model"
    if stem[0].isdigit():
        stem = f"m_{stem}"
    base = f"{stem}_{_peak_label(peak_bytes)}"
    name, count = f"{base}.py", 1
    while (Path(directory) / name).exists():
        count += 1
        name = f"{base}_{count}.py"
    return name


def _peak_label(peak_bytes: int) -> str:
    """Three significant digits and a binary unit, '.' written 'p': 2.77 MiB -> '2p77MiB'."""
    value, unit = float(peak_bytes), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    digits = 0 if value >= 100 else 1 if value >= 10 else 2
    return f"{value:.{digits}f}".replace(".", "p") + unit


class ExportPanel(ipw.VBox):
    """File name, Export button and where the file went (class `remat-export`).

    Relative names are resolved against `directory` (the folder the app was started from,
    not the kernel's), and the message gives the absolute path and how to use the module.
    Listeners registered with `on_export` get the written path, e.g. a `VerifyPanel`.
    """

    def __init__(
        self, schedule: Any = None, directory: str | Path = ".", status: StatusLine | None = None
    ) -> None:
        self.schedule = schedule
        self.directory = Path(directory)
        self.status = status or StatusLine()
        self._listeners: list[Listener] = []
        self.file_name = ipw.Text(
            value="schedule.py", description="file", layout={"width": "320px"}
        )
        self.export_button = ipw.Button(description="Export", icon="download")
        self.export_button.on_click(lambda _: self.export())
        self.message = ipw.HTML()
        rows: list[ipw.Widget] = [ipw.HBox([self.file_name, self.export_button]), self.message]
        if status is None:
            rows.append(self.status)
        super().__init__(rows)
        self.add_class("remat-export")
        self.set_schedule(schedule)

    def set_schedule(self, schedule: Any, file_name: str | None = None) -> None:
        """Export `schedule` next; `file_name` replaces the suggested name."""
        self.schedule = schedule
        if file_name:
            self.file_name.value = file_name
        self.export_button.disabled = schedule is None

    def on_export(self, listener: Listener) -> None:
        """Call `listener(path)` after each successful export."""
        self._listeners.append(listener)

    def export(self) -> Path | None:
        """Write the module; errors go to the status line. Returns the path written."""
        try:
            path = self._export()
        except UserError as error:
            self.status.error(str(error))
            return None
        except OSError as error:
            self.status.error(f"could not write {self.file_name.value}: {error.strerror}")
            return None
        module = path.stem
        self.message.value = (
            f"wrote <code>{html.escape(str(path))}</code>: "
            f"<code>import {html.escape(module)}; model = {html.escape(module)}.wrap(model)</code>"
        )
        self.status.ok(f"exported to {path}")
        for listener in self._listeners:
            listener(path)
        return path

    def _export(self) -> Path:
        if self.schedule is None:
            raise UserError("pick a point on the front before exporting")
        name = self.file_name.value.strip()
        if not name.endswith(".py"):
            raise UserError(f"the file name must end in .py, not {name!r}")
        path = Path(name).expanduser()
        if not path.is_absolute():
            path = self.directory / path
        if path.exists():  # a page has no "are you sure?": never replace a file from here
            raise UserError(f"{path.name} exists in {path.parent}: choose another file name")
        return Path(self.schedule.export(path.resolve())).resolve()
