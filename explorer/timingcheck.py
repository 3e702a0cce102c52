"""Whether other work on the machine disturbed the profile's timings, in words.

Every predicted overhead rests on the profile's timings: the operators' seconds, and the whole
step timed unmodified and under the runtime (explorer.stepcost). On a quiet machine they
agree: the runtime's compiled graphs ran at 0.97x to 1.14x the seconds their operators were
profiled at (googlenet b2 64 px, resnet18 b16 64 px, resnet50 b8 128 px, sample:tiny_cnn b4
32 px, sample:gpt b8 256, mobilenet_v2 b16 96 px, sample:unet b2 32 px, efficientnet_b0 b4
64 px, swin_t b2 64 px), and the rounds' ratios of the two steps spread 3% to 12% around
their median. With
two other processes busy on this 2-core machine they did not: the graphs ran at 2.6x and
0.24x their profiled seconds (googlenet, resnet18), the ratios spread 30% to 215%, and a
sweep of GoogLeNet printed -82.5% overhead at every point, where verify measured +15%.
Nothing is refused (the memory plan holds whatever the timings); the front says so, so that
its overheads are not taken at their word.
"""

from __future__ import annotations

import statistics

# the runtime's graphs running this many times faster or slower than their operators'
# profiled seconds, or the rounds' ratios spreading this much around their median (their
# interquartile range over it, judged from SPREAD_ROUNDS rounds on), mean disturbed timings
PACE_LIMIT = 1.5
SPREAD_LIMIT = 0.25
SPREAD_ROUNDS = 4


def ratio_spread(ratios: list[float]) -> float | None:
    """The interquartile range of the rounds' ratios over their median (None: too few
    rounds to tell)."""
    if len(ratios) < SPREAD_ROUNDS:
        return None
    low, middle, high = statistics.quantiles(ratios, n=4)
    return (high - low) / middle if middle > 0 else None


def timing_note(
    graph_seconds: float | None, profiled_seconds: float, spread: float | None
) -> str | None:
    """Where the timings look disturbed, in words (None otherwise): `graph_seconds`, of the
    runtime's step without recomputation, inside its graphs; `profiled_seconds`, the same
    operators' profiled seconds; `spread`, of the timed rounds' ratios (ratio_spread)."""
    signs = []
    if graph_seconds and profiled_seconds > 0:
        pace = graph_seconds / profiled_seconds
        if not 1 / PACE_LIMIT <= pace <= PACE_LIMIT:
            signs.append(f"the compiled graphs ran at {pace:.2f}x their operators' profiled time")
    if spread is not None and spread > SPREAD_LIMIT:
        signs.append(
            f"the wrapped step's ratio to the unmodified one moved {spread:.0%} between rounds"
        )
    if not signs:
        return None
    return (
        "the profile's timings look disturbed by other work on this machine "
        f"({'; '.join(signs)}): predicted overheads may be far off; profile again when the "
        "machine is quiet, or time longer (REMAT_EXPLORER_TIMING_SECONDS)"
    )
