"""The Python API: one object that carries a model through the pipeline.

    plan = Planner(model, example_input)
    plan.profile()                      # capture + time every operator on the model's device
    front = plan.sweep(points=12)       # the Pareto front of schedules
    schedule = front.at_budget("6 GB")  # or a fraction of the no-recompute peak: 0.5
    schedule.export("resnet50_6GB.py")
    report = schedule.verify()

Widgets and the command line call exactly these methods; nothing here prints.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch import nn

from explorer.capture import Capture, capture
from explorer.errors import UserError
from explorer.export import write_module
from explorer.graph import Graph
from explorer.memory import tensor_bytes
from explorer.models import ModelSpec
from explorer.profile import Profile, profile_step
from explorer.program import baseline_schedule, compile_program
from explorer.progress import CancelToken, ProgressFn
from explorer.schedule import Schedule
from explorer.simulate import Timeline, simulate
from explorer.solve import Solver, evaluate
from explorer.solvers.registry import DEFAULT as DEFAULT_SOLVER
from explorer.solvers.registry import make_solver
from explorer.sweep import Front, sweep_budgets
from explorer.units import parse_budget


class Planner:
    """Plans rematerialization for one model, one example input shape, on one device."""

    def __init__(
        self,
        model: nn.Module,
        example_input: torch.Tensor | tuple | list,
        *,
        spec: ModelSpec | None = None,
        max_stages: int = 48,
    ) -> None:
        if isinstance(example_input, torch.Tensor):
            example_input = (example_input,)
        self.model = model.train()
        self.example_inputs = tuple(example_input)
        if not self.example_inputs or not all(
            isinstance(x, torch.Tensor) for x in self.example_inputs
        ):
            raise UserError("example_input must be a tensor or a tuple of tensors")
        self.spec = spec
        self.max_stages = max_stages
        self._capture: Capture | None = None
        self._profile: Profile | None = None
        self.solver_name = DEFAULT_SOLVER
        self.solver_cache: Path | None = None  # JSON beside the profile: faster re-sweeps
        self._solvers: dict[tuple[str, float | None], Solver] = {}
        self._baseline: Schedule | None = None

    # -- pipeline ----------------------------------------------------------------------------

    def capture(self) -> Graph:
        """Trace the training step into an operator graph (cached)."""
        if self._capture is None:
            self._capture = capture(self.model, self.example_inputs)
        return self._capture.graph

    @property
    def device(self) -> torch.device:
        return self.example_inputs[0].device

    def profile(
        self, progress: ProgressFn | None = None, cancel: CancelToken | None = None
    ) -> Profile:
        """Time every operator on the model's device (cached)."""
        self.capture()
        if self._profile is None:
            static = [
                *(p for _, p in self.model.named_parameters()),
                *(b for _, b in self.model.named_buffers()),
                *self.example_inputs,
            ]
            self._profile = profile_step(self._capture, static, progress=progress, cancel=cancel)
        return self._profile

    def use_profile(self, profile: Profile) -> None:
        """Plan with a saved profile (from another run or machine) instead of profiling."""
        graph = self.capture()
        if profile.fingerprint != graph.fingerprint():
            raise UserError(
                f"the profile is for graph {profile.fingerprint}, this model traces to "
                f"{graph.fingerprint()}: profile this model again"
            )
        self._profile = profile
        self._solvers.clear()
        self._baseline = None

    def solver(
        self,
        time_limit: float | None = None,
        progress: ProgressFn | None = None,
        cancel: CancelToken | None = None,
        name: str | None = None,
    ) -> Solver:
        """The prepared solver, cached per name and time limit. `name` picks one of
        explorer.solvers.registry ("chain", "exact", "table") and makes it the one that
        sweep() and solve() use from then on."""
        self.solver_name = name or self.solver_name
        key = (self.solver_name, time_limit)
        if key not in self._solvers:
            profile = self.profile(cancel=cancel)
            self._solvers[key] = make_solver(
                self.solver_name,
                self.capture(),
                profile,
                time_limit=time_limit,
                max_stages=self.max_stages,
                progress=progress,
                cancel=cancel,
                cache=self.solver_cache,
            )
        return self._solvers[key]

    def sweep(
        self,
        points: int = 12,
        time_limit: float | None = None,
        progress: ProgressFn | None = None,
        on_point=None,
        cancel: CancelToken | None = None,
    ) -> Front:
        """Solve `points` budgets from the feasible minimum to no recomputation."""
        solver = self.solver(time_limit, cancel=cancel)
        found = sweep_budgets(
            solver, points, progress=progress, on_point=self._attach(on_point), cancel=cancel
        )
        for point in found:
            point.schedule.context = self
        setup = solver.setup
        return Front(
            model=self.made_for(),
            fingerprint=solver.fingerprint,
            baseline_peak_bytes=solver.baseline.predicted_peak_bytes,
            baseline_step_seconds=solver.baseline.predicted_seconds,
            fixed_bytes=solver.fixed_bytes,
            points=found,
            setup={
                "stages": setup.stages,
                "distinct_stages": setup.distinct_stages,
                "ilps": setup.ilps,
                "ilp_seconds": setup.ilp_seconds,
                "table_seconds": setup.table_seconds,
                "worst_gap": setup.worst_gap,
                "device": self._profile.device_name if self._profile else "",
            },
            context=self,
        )

    def _attach(self, on_point):
        if on_point is None:
            return None

        def forward(point) -> None:
            point.schedule.context = self
            on_point(point)

        return forward

    def solve(self, budget: int | str | float, time_limit: float | None = None) -> Schedule:
        """The fastest schedule within `budget`: bytes, "4GB", or a fraction (see
        explorer.units.parse_budget: 0.5 keeps half of the activation memory)."""
        solver = self.solver(time_limit)
        limit = parse_budget(budget, solver.baseline.predicted_peak_bytes, solver.fixed_bytes)
        schedule = solver.solve(limit)
        schedule.context = self
        return schedule

    def baseline(self) -> Schedule:
        """No recomputation: keep what autograd keeps (needs a profile, not the solver)."""
        if self._baseline is None:
            graph = self.capture()
            self._baseline = evaluate(graph, self.profile(), baseline_schedule(graph))
        schedule = Schedule.from_dict(self._baseline.to_dict())
        schedule.context = self
        return schedule

    # -- what schedules delegate to ----------------------------------------------------------

    def timeline(self, schedule: Schedule) -> Timeline:
        graph = self.capture()
        workspace = self._profile.workspace if self._profile else None
        return simulate(graph, compile_program(graph, schedule), workspace)

    def made_for(self) -> dict:
        """What an exported schedule records about the model it was made for."""
        graph = self.capture()
        spec = self.spec
        name = spec.name if spec else type(self.model).__name__
        return {
            "model": {
                "name": name,
                "batch_size": spec.batch_size if spec else int(self.example_inputs[0].shape[0]),
                "input_size": spec.input_size if spec else None,
                "buildable": spec is not None,
            },
            "input_shapes": [list(x.shape) for x in self.example_inputs],
            "input_dtypes": [str(x.dtype) for x in self.example_inputs],
            "param_names": [n for n, _ in self.model.named_parameters()],
            "fingerprint": graph.fingerprint(),
            "device": str(self.device),
            "seed": 0,
            "static_bytes": tensor_bytes(
                [*self.model.parameters(), *self.model.buffers(), *self.example_inputs]
            ),
            "baseline_peak_bytes": self.baseline().predicted_peak_bytes,
        }

    def export(self, schedule: Schedule, path: str | Path) -> Path:
        return write_module(schedule, self.made_for(), path)

    def verify_schedule(self, schedule: Schedule, device: str | None = None, path=None):
        from explorer.verify import verify

        if path is None:
            folder = Path(tempfile.mkdtemp(prefix="remat_"))
            path = folder / "schedule.py"
        written = self.export(schedule, path)
        if device is not None and torch.device(device) != self.device:
            raise UserError("verify on another device: export and run `remat-explorer verify`")
        return verify(written, model=self.model, example_inputs=self.example_inputs)
