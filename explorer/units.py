"""Byte counts for people: parse "4GB", "512MiB" or a fraction such as 0.5; print them short."""

from __future__ import annotations

import math
import os
import re

from explorer.errors import BelowMinimum, UserError

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

BUDGET_FORMS = "use a size with a unit (4GB, 512MiB, 300000B) or a fraction such as 0.5"


def parse_budget(text: str | int | float, baseline_bytes: int, fixed_bytes: int = 0) -> int:
    """Bytes from a size with a unit ("4GB", "512MiB", "300000B") or a fraction ("0.5").

    Text must say which it is: a size carries a unit (B for plain bytes), a fraction is a
    number in (0, 1] written with a decimal point. A bare whole number such as "1" could mean
    one byte or the whole no-recompute peak, so it is refused with both spellings offered.
    From Python, an int is bytes and a float is a fraction.

    A fraction is of the memory recomputation can act on: `fixed_bytes` (parameters, buffers,
    inputs and parameter gradients, which every schedule holds at the end of the backward)
    plus that fraction of what the no-recompute peak `baseline_bytes` needs beyond them. So
    0.5 keeps half the activation memory, and 1.0 is the no-recompute peak.
    """
    if isinstance(text, bool):
        raise UserError(f"budget {text!r} is not a size")
    if isinstance(text, int):
        return _positive(text, text)
    if isinstance(text, float):
        return _fraction(text, baseline_bytes, fixed_bytes)
    raw = str(text).strip()
    match = re.fullmatch(r"(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)", raw)
    if not match:
        raise UserError(f"budget {raw!r} is not a size: {BUDGET_FORMS}")
    digits, unit = match.group(1), match.group(2).lower()
    if unit == "" and "." in digits:
        return _fraction(float(digits), baseline_bytes, fixed_bytes)
    if unit == "":
        raise UserError(
            f"budget {raw!r} is ambiguous: write {raw}B for bytes, or a fraction "
            "with a decimal point (1.0 is the no-recompute peak, 0.5 half the activations)"
        )
    if unit not in _UNITS:
        raise UserError(
            f"budget {raw!r}: unknown unit {match.group(2)!r} (use B, MB, MiB, GB, GiB)"
        )
    return _positive(int(float(digits) * _UNITS[unit]), raw)


def _fraction(value: float, baseline_bytes: int, fixed_bytes: int) -> int:
    if not 0 < value <= 1:
        raise UserError(
            f"budget fraction {value} must be in (0, 1]; a size needs a unit, e.g. {value}GB"
        )
    return int(fixed_bytes + value * max(baseline_bytes - fixed_bytes, 0))


def least_fraction(lowest_bytes: int, baseline_bytes: int, fixed_bytes: int) -> float:
    """The least budget fraction, in thousandths, that `parse_budget` reads as at least
    `lowest_bytes` (rounded up: a fraction printed rounded to nearest can still be refused)."""
    span = max(baseline_bytes - fixed_bytes, 1)
    thousandths = max(math.ceil((lowest_bytes - fixed_bytes) / span * 1000), 1)
    while thousandths < 1000 and _fraction(thousandths / 1000, baseline_bytes, fixed_bytes) < (
        lowest_bytes
    ):
        thousandths += 1
    return min(thousandths, 1000) / 1000


def below_minimum(
    budget: int, lowest: int, where: str, baseline_bytes: int, fixed_bytes: int
) -> BelowMinimum:
    """The error for a budget under the least peak known: both in bytes (to a tenth of a MiB
    they can read the same: googlenet at batch 2, 64 px, asked for 0.5 of its activations,
    read "100.9 MiB is below the front's minimum 100.9 MiB"), and the least fraction that
    fits, since fractions are what people type."""
    fraction = least_fraction(lowest, baseline_bytes, fixed_bytes)
    return BelowMinimum(
        f"budget {format_bytes(budget)} ({budget} bytes) is below {where} "
        f"{format_bytes(lowest)} ({lowest} bytes; as a fraction, {fraction:.3f} or more)"
    )


def _positive(value: int, raw: object) -> int:
    if value <= 0:
        raise UserError(f"budget {raw!r} must be positive")
    return value


def seconds_from_environment(variable: str, default: float, what: str) -> float:
    """Seconds from the environment variable `variable` (`default` when unset or blank):
    a finite number of at least 0, else a UserError naming the variable and `what` it sets,
    so that a setting every process a command starts inherits is refused before any work."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise UserError(
            f"{variable}={text!r} is not a number of seconds: give 0 or more "
            f"({what}; {default:g} when unset)"
        )
    return seconds


def format_bytes(n: int | float) -> str:
    """Short human form, binary units: 1536 -> '1.5 KiB'."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def format_seconds(seconds: float) -> str:
    """Three significant digits, in ms under a second: 0.000214 -> '0.214 ms' (a small
    model's step read '0.000 s')."""
    if seconds >= 1:
        return f"{seconds:.3g} s" if seconds < 1000 else f"{seconds:.0f} s"
    return f"{seconds * 1000:.3g} ms"
