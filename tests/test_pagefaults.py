"""Page faults: counted as the system counts them, timed on this machine, and spoken of in
verify's table only when they move the measured overhead by a point or more, under the front
only when the unmodified step's cost 3% of it or more."""

from __future__ import annotations

import json
import mmap
from dataclasses import replace

import pytest
from helpers import planner

from explorer import pagefaults
from explorer.errors import UserError
from explorer.pagefaults import (
    KEEP_MEMORY,
    fault_note,
    front_fault_note,
    minor_faults,
    seconds_per_fault,
)
from explorer.sweep import Front

counted = pytest.mark.skipif(minor_faults() is None, reason="no getrusage on this system")


@counted
def test_writing_fresh_memory_counts_faults_and_writing_it_again_fewer():
    # catches: a count that is not the process's faults (a constant, another clock)
    size = 8 * 2**20
    with mmap.mmap(-1, size) as memory:
        before = minor_faults()
        for offset in range(0, size, mmap.PAGESIZE):
            memory[offset] = 1
        first = minor_faults() - before
        before = minor_faults()
        for offset in range(0, size, mmap.PAGESIZE):
            memory[offset] = 2
        again = minor_faults() - before
    assert first > 0 and again < first


@counted
def test_a_fault_costs_some_microseconds_here():
    each = seconds_per_fault()
    assert each is not None and 0 < each < 1e-3


@pytest.mark.parametrize(
    ("unmodified", "schedule", "said"),
    [(20_000, 0, True), (0, 20_000, True), (3_000, 0, False), (20_000, 19_000, False)],
)
def test_the_note_speaks_when_the_faults_move_the_overhead_by_a_point(
    monkeypatch, unmodified, schedule, said
):
    # catches: a note on every verify (faults differ by a few in any two steps), or none
    # where they move the measured overhead (mobilenet_v2 b16 96 px's lowest point: 8,045
    # faults a step unmodified, none under the schedule, 9.9 points of a 0.23 s step)
    monkeypatch.setattr(pagefaults, "seconds_per_fault", lambda: 2.5e-6)
    note = fault_note(unmodified, schedule, step_seconds=2.5)  # 10,000 faults: a point
    assert (note is not None) == said, note
    if said:
        points = (schedule - unmodified) * 2.5e-6 / 2.5 * 100
        assert f"{points:+.1f} points of the measured overhead" in note
        assert f"faulted {schedule:,} times, the unmodified step {unmodified:,}" in note
        assert KEEP_MEMORY in note


def test_no_note_where_faults_cannot_be_timed(monkeypatch):
    monkeypatch.setattr(pagefaults, "seconds_per_fault", lambda: None)
    assert fault_note(1_000_000, 0, step_seconds=0.1) is None


@pytest.mark.parametrize(("faults", "said"), [(14_265, True), (2_000, False), (0, False)])
def test_the_front_speaks_of_the_unmodified_step_s_faults_from_three_points(
    monkeypatch, faults, said
):
    # catches: predictions shown with no word that the unmodified step spent a share of its
    # time faulting that a lower peak may save (mobilenet_v2 b16 96 px: 14,265 faults, about
    # 18% of its 224 ms step), or a word on every front
    monkeypatch.setattr(pagefaults, "seconds_per_fault", lambda: 2.8e-6)
    note = front_fault_note(faults, step_seconds=0.224)
    assert (note is not None) == said, note
    if said:
        assert "page-faulted 14,265 times a step when profiled (about 18% of its" in note
        assert KEEP_MEMORY in note


@pytest.fixture(scope="module")
def front():
    """sample:tiny_mlp's front, swept from a profile on this machine."""
    return planner("sample:tiny_mlp", 4, None).sweep(points=2)


def test_the_front_carries_the_profile_s_faults_and_its_file_keeps_them(
    front, tmp_path, monkeypatch
):
    # catches: a front (or its file) without the unmodified step's faults, where the CLI
    # and the dashboard read them from
    times = front.context.profile().step_times
    assert front.unmodified_faults == times.eager_faults
    assert front.unmodified_step_seconds == times.eager_seconds
    faulting = replace(front, unmodified_faults=10**6)
    monkeypatch.setattr(pagefaults, "seconds_per_fault", lambda: 2.8e-6)
    assert faulting.faults_note() in faulting.notes()
    again = Front.load(faulting.save(tmp_path / "front.json"))
    assert again.unmodified_faults == 10**6
    assert again.unmodified_step_seconds == front.unmodified_step_seconds
    data = json.loads((tmp_path / "front.json").read_text())
    del data["unmodified_page_faults"], data["unmodified_step_seconds"]  # an older file
    (tmp_path / "older.json").write_text(json.dumps(data))
    older = Front.load(tmp_path / "older.json")
    assert older.unmodified_faults is None and older.faults_note() is None
    for key, bad, says in (
        ("unmodified_page_faults", -1, "-1 is not a count of page faults"),
        ("unmodified_step_seconds", 0, "0 is not a number of seconds"),
    ):
        (tmp_path / "bad.json").write_text(json.dumps({**data, key: bad}))
        with pytest.raises(UserError, match=f"corrupt front file .*{says}"):
            Front.load(tmp_path / "bad.json")
