"""The Pareto plot: peak memory against step-time overhead (over the unmodified model's step)
for every schedule on offer."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import ipywidgets as ipw
import plotly.graph_objects as go

from remat_explorer.widgets.choice import Choice
from remat_explorer.widgets.plotstyle import PLOT_FRAME
from remat_explorer.widgets.units import format_bytes, format_overhead, mib

PEER_SYMBOLS = ("diamond", "square", "triangle-up", "cross", "star", "x")
FRONT, ON_DEMAND, BASELINE, SELECTED = range(4)


def _trace(name: str, mode: str, **marker: Any) -> dict[str, Any]:
    return {
        "type": "scatter",
        "name": name,
        "mode": mode,
        "x": [],
        "y": [],
        "hovertext": [],
        "hoverinfo": "text+name",
        "marker": marker,
    }


class ParetoPlot(ipw.VBox):
    """A plotly FigureWidget (class `remat-pareto`) of the front, the baseline and the peers.

    Traces: the swept front (points appear as `add` is called, one per solved budget),
    budgets solved on demand, the no-recompute baseline, a ring on the selected point, and one
    trace per peer technique (`explorer.peers.PeerPoint.name`). Hover text names the peak,
    the overhead and what is recomputed. Pass `front` to draw a finished front at once: data
    given to the constructor is on the page when it loads.
    """

    def __init__(self, front: Any = None) -> None:
        self.choices: list[Choice] = []
        self.selected: Choice | None = None
        data = [
            _trace("front", "lines+markers", size=9, color="#1f77b4"),
            _trace("solved on demand", "markers", size=9, color="#17becf"),
            _trace(
                "unmodified model (predicted peak)",
                "markers",
                size=12,
                color="#444",
                symbol="circle-open-dot",
            ),
            _trace(
                "selected",
                "markers",
                size=20,
                color="rgba(0,0,0,0)",
                line={"width": 3, "color": "#d62728"},
            ),
        ]
        if front is not None:
            self.choices = sorted(
                (Choice.from_point(p) for p in front.points), key=lambda c: c.peak_bytes
            )
            data[FRONT].update(self._xy(c for c in self.choices if not c.on_demand))
            data[BASELINE].update(self._baseline_xy(front.baseline_peak_bytes))
        self.figure = go.FigureWidget(
            data=data,
            layout={
                "title": {"text": "peak memory against step-time overhead"},
                "xaxis": {"title": {"text": "predicted peak (MiB)"}},
                "yaxis": {"title": {"text": "over the unmodified step (%)"}, "ticksuffix": "%"},
                **PLOT_FRAME,
            },
        )
        super().__init__([self.figure])
        self.add_class("remat-pareto")

    def add(self, choice: Choice) -> None:
        """Add one solved schedule (a sweep calls this once per point, through `TaskRunner.ui`)."""
        self.choices.append(choice)
        self.choices.sort(key=lambda c: c.peak_bytes)
        index = ON_DEMAND if choice.on_demand else FRONT
        points = (c for c in self.choices if c.on_demand == choice.on_demand)
        self.figure.data[index].update(self._xy(points))

    def keep_only(self, keep: list[Choice]) -> None:
        """Redraw with only these points (e.g. once a sweep has dropped dominated ones)."""
        with self.figure.batch_update():
            self.choices = sorted(keep, key=lambda c: c.peak_bytes)
            self.figure.data[FRONT].update(self._xy(c for c in self.choices if not c.on_demand))
            self.figure.data[ON_DEMAND].update(self._xy(c for c in self.choices if c.on_demand))

    def set_baseline(self, peak_bytes: int) -> None:
        """The unmodified model's point: its peak at zero overhead."""
        self.figure.data[BASELINE].update(self._baseline_xy(peak_bytes))

    def set_peers(self, peers: Iterable[Any]) -> None:
        """One trace per measured peer technique (`PeerPoint`s), replacing any drawn before.

        Peers that could not run (NaN step time, the reason in `detail`) are not drawn.
        """
        measured = [p for p in peers if not math.isnan(p.step_seconds)]
        with self.figure.batch_update():
            self.figure.data = self.figure.data[: SELECTED + 1]
            for i, peer in enumerate(measured):
                self.figure.add_scatter(
                    name=peer.name,
                    mode="markers",
                    x=[mib(peer.peak_bytes)],
                    y=[peer.overhead * 100],
                    hoverinfo="text+name",
                    hovertext=[
                        f"{peer.name}<br>measured peak {format_bytes(peer.peak_bytes)}<br>"
                        f"overhead {format_overhead(peer.overhead)}<br>{peer.detail}"
                    ],
                    marker={"size": 11, "symbol": PEER_SYMBOLS[i % len(PEER_SYMBOLS)]},
                )

    def select(self, choice: Choice | None) -> None:
        """Ring the chosen point (or clear the ring with None)."""
        self.selected = choice
        self.figure.data[SELECTED].update(self._xy([] if choice is None else [choice]))

    def clear(self) -> None:
        """Forget every point, e.g. when the model or its input changes."""
        with self.figure.batch_update():
            self.choices = []
            self.selected = None
            for trace in self.figure.data[: SELECTED + 1]:
                trace.update(x=[], y=[], hovertext=[])
            self.figure.data = self.figure.data[: SELECTED + 1]

    @staticmethod
    def _xy(choices: Iterable[Choice]) -> dict[str, list]:
        chosen = list(choices)
        return {
            "x": [mib(c.peak_bytes) for c in chosen],
            "y": [c.overhead * 100 for c in chosen],
            "hovertext": [c.hover() for c in chosen],
        }

    @staticmethod
    def _baseline_xy(peak_bytes: int) -> dict[str, list]:
        return {
            "x": [mib(peak_bytes)],
            "y": [0.0],
            "hovertext": [
                f"unmodified model<br>peak {format_bytes(peak_bytes)} (predicted)<br>overhead +0.0%"
            ],
        }
