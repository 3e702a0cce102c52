"""What a solver decides, as plain data: which tensors survive the forward, and the order of
everything that runs in the backward (recomputations included).

The forward always runs every forward operator once, in traced order, so random operators
draw exactly what the unmodified model draws. A schedule then keeps `saved` alive for the
backward and frees the rest as early as possible. `backward` lists node names in execution
order: backward operators, and forward operators that are recomputed there (a forward node
may appear several times: each appearance is one recomputation).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.graph import ValueRef


@dataclass
class Schedule:
    """One executable plan for the training step, plus what the planner predicted for it."""

    fingerprint: str
    saved: list[ValueRef]
    backward: list[str]
    predicted_peak_bytes: int = 0
    predicted_seconds: float = 0.0
    baseline_seconds: float = 0.0
    budget_bytes: int | None = None
    status: str = "optimal"
    gap: float = 0.0
    solve_seconds: float = 0.0
    recomputed: list[str] = field(default_factory=list)
    context: object | None = field(default=None, repr=False, compare=False)

    @property
    def predicted_overhead(self) -> float:
        """Extra compute over the no-recompute step: 0.05 means 5% more."""
        if self.baseline_seconds <= 0:
            return 0.0
        return self.predicted_seconds / self.baseline_seconds - 1.0

    def recomputed_ops(self) -> list[str]:
        return list(self.recomputed)

    def to_dict(self) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "saved": [list(r) for r in self.saved],
            "backward": list(self.backward),
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_seconds": self.predicted_seconds,
            "baseline_seconds": self.baseline_seconds,
            "budget_bytes": self.budget_bytes,
            "status": self.status,
            "gap": self.gap,
            "solve_seconds": self.solve_seconds,
            "recomputed": list(self.recomputed),
        }

    @classmethod
    def from_dict(cls, data: dict) -> Schedule:
        fields = dict(data)
        fields["saved"] = [tuple(r) for r in data["saved"]]
        return cls(**fields)

    # the planner attaches itself as `context`; these delegate to it so a schedule is usable alone
    def timeline(self):
        """Memory after each operator (see explorer.simulate)."""
        return self._planner().timeline(self)

    def export(self, path):
        """Write a Python module that wraps the model to follow this schedule."""
        return self._planner().export(self, path)

    def verify(self, device: str | None = None, path=None):
        """Export to a temporary file (or `path`) and check it against the unmodified model."""
        return self._planner().verify_schedule(self, device=device, path=path)

    def _planner(self):
        if self.context is None:
            raise RuntimeError("this schedule is not attached to a Planner; load it through one")
        return self.context
