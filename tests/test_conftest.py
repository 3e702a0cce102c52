"""The promises tests/conftest.py makes about the suite itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import conftest


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
