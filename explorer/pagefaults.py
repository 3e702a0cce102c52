"""Page faults of a timed step on the CPU, and what one costs here.

glibc, as it comes, hands large freed blocks back to the system, so a step faults fresh pages
in again for what it allocates, and a schedule with a lower peak faults fewer of them than the
unmodified step. The profile times operators in the no-recompute step, faults and all, so
such a schedule then costs less than predicted: mobilenet_v2 b16 96 px at its lowest point,
predicted +39.3%, measured +22.9%, where the unmodified step faulted 8,045 times a step and
the schedule none (2.8 µs a fault on the machine of docs/BENCHMARKS.md). Told to keep its
memory (`MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=8589934592`) glibc faults
none in either, and predictions hold. The profile counts the unmodified step's faults, and
the front says when they cost 3% or more of it; `verify` counts the faults of both steps and
says when their difference moves the measured overhead.

How many faults a step takes is not modelled: it hangs on where glibc's heap was last
trimmed, and moves from one step to the next (resnet50 b8 128 px's unmodified step, six steps
in one process: 5,249 to 44,209 faults, 878 to 965 ms, about 2.2 µs a fault). So the note's
figure, from the medians, is as rough as the measured overhead it speaks of.

The counts are the process's minor faults (`getrusage`), so a thread of the process that
faults during a step counts too; None where the system does not count them.
"""

from __future__ import annotations

import functools
import mmap
import statistics
import time
from collections.abc import Callable
from typing import TypeVar

from explorer.units import format_seconds

try:
    import resource
except ImportError:  # Windows: no getrusage
    resource = None  # type: ignore[assignment]

# what a reader of the table is told to set, glibc's names (docs/BENCHMARKS.md)
KEEP_MEMORY = "MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=8589934592"
# the least share of the unmodified step that the faults' difference must cost before
# verify's table speaks of it: a point of overhead
NOTABLE_SHARE = 0.01
# the least share of the unmodified step that its own faults must cost before the front
# speaks of them: what a schedule that faults none could gain, the 3 points
NOTABLE_FRONT_SHARE = 0.03
# fresh memory touched to time a fault: enough pages that the timer's resolution and the
# loop's own cost (the second, faultless pass) are small beside them
CALIBRATION_BYTES = 32 * 2**20
# times it is touched, each afresh: the least cost counts, as a disturbed pass only adds
# (one pass in ten read 4.4 to 14 µs a fault where the rest read 2.7 to 2.9 µs)
CALIBRATION_PASSES = 3


def minor_faults() -> int | None:
    """Minor page faults of this process so far; None where the system does not count them."""
    if resource is None:
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


_Result = TypeVar("_Result")


def faults_of(call: Callable[[], _Result]) -> tuple[_Result, int | None]:
    """What `call()` returns, and the minor faults the process took during it (None where
    the system does not count them): wrapped around a timed step, outside its clock."""
    before = minor_faults()
    result = call()
    after = minor_faults()
    return result, None if before is None or after is None else after - before


def median_faults(counts: list[int | None]) -> int | None:
    """The median of some steps' fault counts, whole; None where any was not counted."""
    if not counts or None in counts:
        return None
    return round(statistics.median(counts))  # type: ignore[type-var]


@functools.cache
def seconds_per_fault() -> float | None:
    """Seconds one minor fault costs on this machine: the least of CALIBRATION_PASSES
    timings (`_one_fault`). Timed once a process; None where faults are not counted (or
    none came)."""
    if minor_faults() is None:
        return None
    timings = [_one_fault() for _ in range(CALIBRATION_PASSES)]
    found = [seconds for seconds in timings if seconds is not None]
    return min(found) if found else None


def _one_fault() -> float | None:
    """Fresh anonymous memory written once a page, less the same writes again once the pages
    are in, over the faults counted."""
    before = minor_faults()
    page = mmap.PAGESIZE
    with mmap.mmap(-1, CALIBRATION_BYTES) as memory:
        started = time.perf_counter()
        for offset in range(0, CALIBRATION_BYTES, page):
            memory[offset] = 1
        first = time.perf_counter() - started
        faults = minor_faults() - before
        started = time.perf_counter()
        for offset in range(0, CALIBRATION_BYTES, page):
            memory[offset] = 2
        again = time.perf_counter() - started
    return max(first - again, 0.0) / faults if faults > 0 else None


def fault_note(unmodified: float, schedule: float, step_seconds: float) -> str | None:
    """A line for verify's table when the schedule's step faults so much less (or more) than
    the unmodified one that the difference moves the measured overhead by NOTABLE_SHARE or
    more: the faults a step of each (medians), what the difference costs, and how to keep
    the memory. None when it moves less, or faults cannot be timed here."""
    priced = _share_of_step(schedule - unmodified, step_seconds)
    if priced is None or abs(priced[0]) < NOTABLE_SHARE:
        return None
    share, each = priced
    return (
        f"page faults: the schedule's step faulted {schedule:,.0f} times, the unmodified "
        f"step {unmodified:,.0f} (medians; at {each * 1e6:.1f} µs a fault, about "
        f"{share * 100:+.1f} points of the measured overhead): the C allocator hands freed "
        f"memory back to the system and faults it in again, less of it under a lower peak; "
        f"predictions assume the memory is kept (glibc: {KEEP_MEMORY})"
    )


def front_fault_note(faults: int, step_seconds: float) -> str | None:
    """A line for the front when the unmodified step, timed while profiling, spent
    NOTABLE_FRONT_SHARE or more of its time faulting pages in: every predicted overhead may
    then be that much too high for a schedule that faults less. None below it, or where
    faults cannot be timed here."""
    priced = _share_of_step(faults, step_seconds)
    if priced is None or priced[0] < NOTABLE_FRONT_SHARE:
        return None
    share, each = priced
    return (
        f"the unmodified step page-faulted {faults:,} times a step when profiled (about "
        f"{share:.0%} of its {format_seconds(step_seconds)}, at {each * 1e6:.1f} µs a fault): "
        f"the C allocator hands freed memory back to the system and faults it in again, less "
        f"of it under a lower peak, so a schedule may cost up to that much less than "
        f"predicted; predictions assume the memory is kept (glibc: {KEEP_MEMORY}), and "
        f"verify counts both steps' faults"
    )


def _share_of_step(faults: float, step_seconds: float) -> tuple[float, float] | None:
    """What `faults` cost as a share of a step of `step_seconds`, and a fault's seconds here;
    None where faults cannot be timed, or the step took no time."""
    each = seconds_per_fault()
    if each is None or step_seconds <= 0:
        return None
    return faults * each / step_seconds, each
