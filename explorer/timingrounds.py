"""How long whole training steps are timed: the profile's runtime factor (explorer.stepcost)
and verify's measured overhead both time interleaved rounds, one unmodified step and one
wrapped step each, as many as fit in the same seconds.

A short step timed in a few rounds gives a ratio that moves from one measurement to the
next: resnet18 b16 64 px (a 0.11 s step) read its runtime factor as 0.924 to 1.062 in eight
profiles with at most 5 rounds, and 0.979 to 1.018 with the 14 that fit in 4 s; verify's
three rounds put sample:unet b2 32 px's no-recompute point at +7.8% to +17.2% from one
verify to the next, twenty at +11.6% to +14.9%. A long step
gets its least rounds whatever the seconds (resnet50 b8 128 px, a 1.2 s step: two in the
profile, three in verify). A short one gets all that fit: capped at 20, sample:tiny_cnn b4
32 px (a 4 ms step) read its no-recompute point at +22% to +31% from one verify to the next,
its first rounds slower than those after, and at +14.1% to +14.4% in the 520 rounds of
4 s; its profile put the runtime factor at 1.30 where the rounds of 4 s put it at 1.16, and
every predicted overhead moved with it. MAX_ROUNDS only keeps a step of microseconds from
timing thousands.

$REMAT_EXPLORER_TIMING_SECONDS changes the seconds for the profile and verify alike (0: the
least rounds; more on a machine whose load moves the steps).
"""

from __future__ import annotations

from explorer.units import seconds_from_environment

TIMING_SECONDS_VARIABLE = "REMAT_EXPLORER_TIMING_SECONDS"
TIMING_SECONDS = 4.0
MAX_ROUNDS = 1000


def timing_seconds() -> float:
    """Seconds of timed rounds: $REMAT_EXPLORER_TIMING_SECONDS where set, else TIMING_SECONDS."""
    return seconds_from_environment(
        TIMING_SECONDS_VARIABLE, TIMING_SECONDS, "how long whole steps are timed"
    )


def another_round(first: list[float], second: list[float], least: int, seconds: float) -> bool:
    """Whether to time one more round, given the seconds each side's steps took so far: until
    `least` rounds, then while the rounds fit in `seconds` and number under MAX_ROUNDS."""
    done = len(first)
    if done < least:
        return True
    return done < MAX_ROUNDS and sum(first) + sum(second) < seconds
