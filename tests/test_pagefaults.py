"""Page faults: counted as the system counts them, timed on this machine, and spoken of in
verify's table only when they move the measured overhead by a point or more."""

from __future__ import annotations

import mmap

import pytest

from explorer import pagefaults
from explorer.pagefaults import KEEP_MEMORY, fault_note, minor_faults, seconds_per_fault

counted = pytest.mark.skipif(minor_faults() is None, reason="no getrusage on this system")


@counted
def test_writing_fresh_memory_counts_faults_and_writing_it_again_none():
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
