"""The one shape the widgets share for a pickable schedule, whatever produced it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from remat_explorer.widgets.units import format_bytes, format_overhead

if TYPE_CHECKING:
    from explorer import Schedule

HOVER_OPS = 6


@dataclass(frozen=True, eq=False)
class Choice:
    """A schedule the user can pick: a point of the swept front, or a budget solved on demand.

    Front points and solved schedules carry the same facts under different names; the plot,
    slider, timeline and export panel read them from here. Compared by identity, so two
    points with equal numbers stay two points.
    """

    peak_bytes: int
    overhead: float
    budget_bytes: int | None
    recomputed: tuple[str, ...]
    schedule: Schedule | None
    on_demand: bool = False

    @classmethod
    def from_point(cls, point: Any) -> Choice:
        """From an `explorer.FrontPoint` (its schedule may be absent in a loaded front)."""
        return cls(
            peak_bytes=point.predicted_peak_bytes,
            overhead=point.predicted_overhead,
            budget_bytes=point.budget_bytes,
            recomputed=tuple(point.recomputed),
            schedule=point.schedule,
        )

    @classmethod
    def from_schedule(cls, schedule: Schedule, on_demand: bool = True) -> Choice:
        """From an `explorer.Schedule`, e.g. what `Planner.solve` returned."""
        return cls(
            peak_bytes=schedule.predicted_peak_bytes,
            overhead=schedule.predicted_overhead,
            budget_bytes=schedule.budget_bytes,
            recomputed=tuple(schedule.recomputed_ops()),
            schedule=schedule,
            on_demand=on_demand,
        )

    def summary(self) -> str:
        """One line: peak, overhead and how much is recomputed."""
        return (
            f"peak {format_bytes(self.peak_bytes)}, overhead {format_overhead(self.overhead)}, "
            f"recomputes {len(self.recomputed)} ops"
        )

    def hover(self) -> str:
        """Plotly hover text: the summary and the first recomputed ops by name."""
        lines = [
            f"peak {format_bytes(self.peak_bytes)}",
            f"overhead {format_overhead(self.overhead)}",
        ]
        if self.budget_bytes is not None:
            lines.append(f"budget {format_bytes(self.budget_bytes)}")
        if not self.recomputed:
            lines.append("recomputes nothing")
        else:
            lines.append(f"recomputes {len(self.recomputed)} ops:")
            lines.extend(self.recomputed[:HOVER_OPS])
            if len(self.recomputed) > HOVER_OPS:
                lines.append(f"... and {len(self.recomputed) - HOVER_OPS} more")
        return "<br>".join(lines)
