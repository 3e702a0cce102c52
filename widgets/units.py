"""How the dashboard writes bytes and overheads, so every widget shows them the same way."""

from __future__ import annotations

MIB = 2**20
GIB = 2**30


def mib(n_bytes: int) -> float:
    """Bytes as MiB: the unit of every plot axis, so points from different sources compare."""
    return n_bytes / MIB


def format_bytes(n_bytes: int) -> str:
    """Bytes for a reader: MiB below 1 GiB, GiB above."""
    if abs(n_bytes) >= GIB:
        return f"{n_bytes / GIB:.2f} GiB"
    return f"{n_bytes / MIB:.1f} MiB"


def format_overhead(overhead: float) -> str:
    """0.05 -> '+5.0%': extra compute over the no-recompute step."""
    return f"{overhead * 100:+.1f}%"
