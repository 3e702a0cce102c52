"""What a plan decides, as plain data.

`GraphSchedule` is the plan for one captured graph (one FX joint graph, see explorer.fxgraph):
which forward values survive the forward (`saved`), and the order of everything that runs in
the backward (`backward`: backward operators and the forward operators recomputed there; a
forward node may appear several times, each appearance one recomputation). The forward always
runs every forward operator it needs once, in traced order, so random operators draw exactly
what the unmodified model draws.

`Schedule` is the plan for a whole training step: one `GraphSchedule` per graph that Dynamo
captured (most models give one graph; code Dynamo cannot trace splits the model into several),
with what the planner predicted for the step. It is what a front holds, what `export` writes
and what the runtime (explorer.backend) applies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.errors import UserError
from explorer.graph import ValueRef


@dataclass(kw_only=True)
class _Predicted:
    """What both kinds of plan carry about the solve: predicted peak and seconds, the
    no-recompute seconds, the budget asked for and the solver's label."""

    predicted_peak_bytes: int = 0
    predicted_seconds: float = 0.0
    baseline_seconds: float = 0.0
    budget_bytes: int | None = None
    status: str = "optimal"
    gap: float = 0.0
    solve_seconds: float = 0.0

    @property
    def predicted_overhead(self) -> float:
        """Extra compute over the no-recompute step: 0.05 means 5% more."""
        if self.baseline_seconds <= 0:
            return 0.0
        return self.predicted_seconds / self.baseline_seconds - 1.0

    def _predicted_dict(self) -> dict:
        return {
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "predicted_seconds": self.predicted_seconds,
            "baseline_seconds": self.baseline_seconds,
            "budget_bytes": self.budget_bytes,
            "status": self.status,
            "gap": self.gap,
            "solve_seconds": self.solve_seconds,
        }


@dataclass
class GraphSchedule(_Predicted):
    """One graph's plan, plus what the solver predicted for that graph alone."""

    fingerprint: str  # of the graph it was made for (explorer.graph.Graph.fingerprint)
    saved: list[ValueRef]
    backward: list[str]
    recomputed: list[str] = field(default_factory=list)
    structure: str = ""  # the graph's shape-free structure hash (Graph.structure)
    # the graph's tangents whose gradients were left out (Graph.unread_tangents): the runtime
    # leaves them out of the joint graphs it captures before matching this schedule
    unread_tangents: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "structure": self.structure,
            "saved": [list(r) for r in self.saved],
            "backward": list(self.backward),
            **self._predicted_dict(),
            "recomputed": list(self.recomputed),
            **({"unread_tangents": self.unread_tangents} if self.unread_tangents else {}),
        }

    @classmethod
    def from_dict(cls, data: dict) -> GraphSchedule:
        fields = dict(data)
        fields["saved"] = [(str(r[0]), int(r[1])) for r in data["saved"]]
        fields["backward"] = [str(n) for n in data["backward"]]
        fields["unread_tangents"] = [str(n) for n in data.get("unread_tangents", [])]
        return cls(**fields)


@dataclass
class Schedule(_Predicted):
    """A whole training step's plan: one GraphSchedule per captured graph, in capture order.

    `runtime_factor` is the runtime's no-recompute step over the unmodified model's, measured
    when profiling (explorer.stepcost; 1.0 where it was not): its predicted overhead is
    against the unmodified model, so even the no-recompute schedule has one. What a schedule
    recomputes adds its operators' seconds to that measured step (`runtime_seconds`), at the
    pace the step's graphs ran at (`graph_seconds` over the profiled `baseline_seconds`),
    rather than scaling them by the factor: what the runtime adds outside its graphs is a
    cost per call (Dynamo's guards, AOTAutograd's wrappers, the wrapped call's checks), which
    recomputation does not grow. sample:tiny_cnn b4 32 px spends 33% of its runtime step
    outside the graphs, resnet50 b8 128 px 2%: scaled by the factor, tiny_cnn's lowest point
    was predicted at +54.7% where verify measured +35% to +39%. Where the step was not
    measured (a plan from the cost model), the no-recompute seconds stand for it; where its
    graphs were not timed (CUDA, an older profile), the pace is 1."""

    graphs: list[GraphSchedule]
    runtime_factor: float = 1.0
    # the runtime's no-recompute step as the profile measured it (explorer.stepcost); None
    # where it was not measured, and in files written before it was recorded
    runtime_seconds: float | None = None
    # of that step, the seconds inside its compiled graphs (None: not measured)
    graph_seconds: float | None = None
    context: object | None = field(default=None, repr=False, compare=False)

    @property
    def predicted_overhead(self) -> float:
        """Predicted step time over the unmodified model's: 0.05 means 5% more."""
        if self.baseline_seconds <= 0:
            return self.runtime_factor - 1.0
        step = self.runtime_seconds or self.baseline_seconds
        # the seconds the graphs' operators take in the runtime's step per second profiled
        pace = self.graph_seconds / self.baseline_seconds if self.graph_seconds else 1.0
        # a plan with the no-recompute step's seconds then costs exactly the runtime's share
        recomputed = (self.predicted_seconds - self.baseline_seconds) * pace / step
        return self.runtime_factor * (1.0 + recomputed) - 1.0

    @property
    def fingerprint(self) -> str:
        """The fingerprints of the graphs it was made for, joined: one string per step."""
        return "+".join(g.fingerprint for g in self.graphs)

    @property
    def recomputed(self) -> list[str]:
        """Operators recomputed in the backward, graph by graph (g1:relu_3 with several
        graphs, plain node names with one)."""
        if len(self.graphs) == 1:
            return list(self.graphs[0].recomputed)
        return [f"g{k + 1}:{name}" for k, g in enumerate(self.graphs) for name in g.recomputed]

    def recomputed_ops(self) -> list[str]:
        return self.recomputed

    def to_dict(self) -> dict:
        return {
            "graphs": [g.to_dict() for g in self.graphs],
            **self._predicted_dict(),
            "runtime_factor": self.runtime_factor,
            "runtime_seconds": self.runtime_seconds,
            "graph_seconds": self.graph_seconds,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Schedule:
        fields = {k: v for k, v in data.items() if k != "graphs"}
        return cls([GraphSchedule.from_dict(g) for g in data["graphs"]], **fields)

    def copy(self) -> Schedule:
        """An independent copy, attached to the same planner."""
        again = Schedule.from_dict(self.to_dict())
        again.context = self.context
        return again

    # a planner attaches itself as `context`; these delegate to it so a schedule is usable alone
    def timeline(self):
        """Memory after each operator of the step (see explorer.simulate)."""
        return self._planner().timeline(self)

    def export(self, path, **options):
        """Write a Python module that wraps the model to follow this schedule."""
        return self._planner().export(self, path, **options)

    def verify(self, device: str | None = None, path=None):
        """Export to `path` (or a temporary file, removed after) and check it against the model."""
        return self._planner().verify_schedule(self, device=device, path=path)

    def _planner(self):
        if self.context is None:
            raise UserError(
                "this schedule has no planner (it was read from a saved front): export it "
                "with `remat-explorer export --front FILE` or explorer.export.write_module"
            )
        return self.context
