"""The promises tests/conftest.py makes about the suite itself."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import conftest
from helpers import planner

from explorer.solve import REFINE_TOTAL


@dataclass
class _Item:
    name: str
    keywords: set[str] = field(default_factory=set)

    def add_marker(self, marker: object) -> None:
        self.keywords.add("skip")


def test_slow_tests_run_after_the_others_in_their_own_order() -> None:
    # catches: the `slow` marker promising an order that nothing implements
    items = [_Item("a", {"slow"}), _Item("b"), _Item("c", {"slow"}), _Item("d")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [item.name for item in items] == ["b", "d", "a", "c"]


def test_quick_search_reaches_the_solver_a_planner_builds(quick_search) -> None:
    # catches: a quick_search the Planner no longer sees (the exactness tests would spend
    # the full refinement on every sweep again, and CI would creep past its limit unnoticed)
    solver = planner("sample:tiny_mlp", 2, None).solver()
    assert [s.refine_left for s in solver.solvers] == [conftest.QUICK_SEARCH_TOTAL]
    assert conftest.QUICK_SEARCH_TOTAL < REFINE_TOTAL


def test_quick_search_reaches_the_processes_a_test_starts(quick_search) -> None:
    # catches: a quick_search that only patches this process, so that the command lines and
    # the docs' examples the tests run would spend the full refinement (CI: +3 minutes)
    code = "from explorer.solvers.registry import search_seconds; print(search_seconds())"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == conftest.QUICK_SEARCH_TOTAL
