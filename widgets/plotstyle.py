"""The frame both plots share, so they line up side by side.

The width is fixed: a FigureWidget added to a page that is already shown (the timeline is)
is drawn before it is attached, so plotly cannot measure its container and would fall back
to 700 px whatever the room.
"""

from __future__ import annotations

from typing import Any

PLOT_FRAME: dict[str, Any] = {
    "width": 600,
    "height": 380,
    "margin": {"l": 60, "r": 20, "t": 50, "b": 50},
    "legend": {"orientation": "h", "y": -0.2},
}
