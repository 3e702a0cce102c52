"""What a solver learned about one profiled step, kept as JSON beside the profile, so that
sweeping the same profile again takes seconds instead of minutes.

Four things are kept: each distinct stage's menu of options (the stage ILPs, the expensive
part of a large step), keyed by the stage's signature and the seconds of its operators;
the verified answers (each schedule as its recomputation windows) with, per solved budget,
whether it was proven optimal and the proven bound; the budgets each sweep solved (a second
sweep asks the same ones, whose answers are all known, instead of looking for the holes its
first run already filled); and the least-peak floor (explorer.solvers.floor). All but the
menus are keyed by the graph, the profile's numbers and the solver's settings. No schedule
read from the file is trusted: every answer is lowered and simulated again before it is
used, and a cache written for another graph, profile or format is ignored (then
overwritten). Plain JSON: never pickle. Without a file the same record is kept in memory,
so one solver never searches a budget twice.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from explorer.errors import UserError
from explorer.files import read_json, write_atomic

FORMAT = 3  # 3: stage signatures count output bytes (a copy into a slice makes its base)


def digest(data: object) -> str:
    """A short stable hash of JSON-able data."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


class SolverCache:
    """One JSON file (None: memory only); `key` says whose answers these are (graph,
    profile, solver)."""

    def __init__(self, path: str | Path | None, key: str) -> None:
        self.path = None if path is None else Path(path)
        self.key = key
        self.data = {
            "format": FORMAT,
            "key": key,
            "stages": {},
            "answers": [],
            "labels": {},
            "sweeps": {},
            "floor": None,
        }
        if self.path is None:
            return
        try:
            loaded = read_json(self.path, what="solver cache")
        except UserError:
            return  # absent or unreadable: start afresh, it is only a cache
        if loaded.get("format") == FORMAT and loaded.get("stages") is not None:
            self.data["stages"] = dict(loaded["stages"])  # menus do not depend on the key
            if loaded.get("key") == key:
                self.data["answers"] = list(loaded.get("answers", []))
                self.data["labels"] = dict(loaded.get("labels", {}))
                self.data["sweeps"] = dict(loaded.get("sweeps", {}))
                self.data["floor"] = loaded.get("floor")

    def stage_menu(self, key: str) -> list[dict] | None:
        menu = self.data["stages"].get(key)
        return menu if isinstance(menu, list) else None

    def put_stage_menu(self, key: str, menu: list[dict]) -> None:
        self.data["stages"][key] = menu

    def answers(self) -> list[list[list[str]]]:
        return [w for w in self.data["answers"] if isinstance(w, list)]

    def put_answers(self, windows: list[list[list[str]]]) -> None:
        self.data["answers"] = windows

    def label(self, key: str) -> tuple[bool, float | None] | None:
        """(proven optimal, proven bound) of an earlier search: `key` is a budget in bytes,
        written out, or "least" for the least-peak search."""
        found = self.data["labels"].get(key)
        if not isinstance(found, list) or len(found) != 2:
            return None
        return bool(found[0]), None if found[1] is None else float(found[1])

    def put_label(self, key: str, optimal: bool, bound: float | None) -> None:
        self.data["labels"][key] = [optimal, bound]

    def floor(self) -> int | None:
        """The least-peak floor found before (explorer.solvers.floor), in bytes."""
        found = self.data.get("floor")
        return found if isinstance(found, int) and not isinstance(found, bool) else None

    def put_floor(self, nbytes: int) -> None:
        self.data["floor"] = nbytes

    def sweep(self, points: int) -> list[int] | None:
        """The budgets an earlier sweep of `points` points solved, in its order."""
        found = self.data["sweeps"].get(str(points))
        if not isinstance(found, list) or not all(isinstance(b, int) for b in found):
            return None
        return found

    def put_sweep(self, points: int, budgets: list[int]) -> None:
        self.data["sweeps"][str(points)] = budgets

    def save(self) -> None:
        if self.path is not None:
            write_atomic(self.path, json.dumps(self.data))
