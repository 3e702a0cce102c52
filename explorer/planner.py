"""The Python API: one object that carries a model through the pipeline.

    plan = Planner(model, args)          # or Planner(model, args, kwargs), as torch.export
    plan.profile()                       # capture + time every operator on the model's device
    front = plan.sweep(points=12)        # the Pareto front of schedules
    schedule = front.at_budget("6 GB")   # or a fraction of the activation memory: 0.5
    schedule.export("resnet50_6GB.py")
    report = schedule.verify()

Widgets and the command line call exactly these methods; nothing here prints.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from explorer import metadevice
from explorer.backend import (
    RecompileLimitReached,
    RematModule,
    input_signature,
    module_inside,
    parameter_signature,
)
from explorer.capture import CapturedGraph, Recorder, capture, timed_runtime
from explorer.devices import PREDICTED
from explorer.eagerpeaks import EagerPeaks, measure_eager_peaks
from explorer.errors import OtherStep, UserError
from explorer.export import write_module
from explorer.graph import Graph
from explorer.losses import loss_name, named_loss
from explorer.memory import tensor_bytes
from explorer.models import ModelSpec, inputs_batch
from explorer.modelstate import as_trained, held_state, tensors_in
from explorer.profile import StepProfile, profile_graph
from explorer.progress import CancelToken, ProgressFn, check_cancel, report
from explorer.schedule import Schedule
from explorer.simulate import Timeline
from explorer.solvers.registry import DEFAULT as DEFAULT_SOLVER
from explorer.solvers.registry import make_solver, search_seconds
from explorer.stepcost import CAPTURED_AT_EVERY_CALL, StepTimes, measure_step_times
from explorer.stepsolver import StepSolver
from explorer.sweep import Front, sweep_budgets
from explorer.timingrounds import timing_seconds
from explorer.units import parse_budget
from explorer.unmodified import unmodified_peak


class Planner:
    """Plans rematerialization for one model and one example input, on the model's device,
    in the modes its layers are in (a model wholly in eval mode is put in train mode).

    `args` is a tensor or a tuple of positional inputs, `kwargs` a dict of keyword inputs (as
    `torch.export` takes them); `autocast` a dtype (torch.bfloat16, torch.float16) to plan the
    step as it runs under `torch.autocast`. A plan made under autocast is its own plan.
    `gradients_held`: every step starts with the parameters' gradients of the one before
    (gradient accumulation, or `zero_grad(set_to_none=False)`), which then count in every
    peak; by default a step starts without them, as after `optimizer.zero_grad()`. `loss`:
    the step backpropagates `loss(outputs)` (a one-element tensor, the targets closed over),
    computed outside the model as a training loop does, rather than a random gradient for
    every output; the outputs count as held through the backward, as a loop that names them
    holds them. A name (`"cross_entropy"`, explorer.losses) is a loss a file can record.
    `stands_for`: a model on the meta device is planned for this kind of device ("cuda" or
    "cpu": its dropouts are split as they would be there, and exports name it); such a
    planner runs nothing, so it needs a profile from the cost model (explorer.costmodel
    .meta_planner makes one)."""

    def __init__(
        self,
        model: nn.Module,
        args: Any = (),
        kwargs: dict | None = None,
        *,
        spec: ModelSpec | None = None,
        autocast: torch.dtype | None = None,
        max_stages: int = 48,
        gradients_held: bool = False,
        loss: Callable[[Any], torch.Tensor] | str | None = None,
        stands_for: str | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise UserError(f"the model must be a torch.nn.Module, not {type(model).__name__}")
        # never the whole model in train mode: that would unfreeze the user's own frozen
        # layers, in the model they go on training, silently
        self.model = as_trained(module_inside(model))
        self.example_inputs = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        self.example_kwargs = dict(kwargs or {})
        if not any(isinstance(x, torch.Tensor) for x in self.tensors):
            raise UserError("the example inputs hold no tensor: pass a tensor or a tuple of them")
        if autocast not in (None, torch.bfloat16, torch.float16):
            raise UserError(f"autocast must be torch.bfloat16 or torch.float16, not {autocast}")
        self.spec = spec
        self.autocast = autocast
        self.max_stages = max_stages
        # each step starts with the gradients the last one left (gradient accumulation over
        # micro-batches, or zero_grad(set_to_none=False)): alive throughout, counted so
        self.gradients_held = gradients_held
        # the step backpropagates loss(outputs), computed outside the model (a name: one of
        # explorer.losses, which the command line and verify can rebuild from a file)
        self.loss = named_loss(loss) if isinstance(loss, str) else loss
        self.stands_for = _stood_for(self.device, stands_for)
        self._captured: list[CapturedGraph] | None = None
        self._timed: tuple[Callable[..., Any], Recorder] | None = None  # _timed_runtime
        self._profile: StepProfile | None = None
        self.solver_name = DEFAULT_SOLVER
        self.solver_cache: Path | None = None  # JSON beside the profile: faster re-sweeps
        self._solvers: dict[tuple[str, float | None], StepSolver] = {}
        self._last_key: tuple[str, float | None] | None = None  # the solver sweeps last used

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The example inputs' tensors, positional then keyword."""
        return tensors_in((self.example_inputs, self.example_kwargs))

    @property
    def device(self) -> torch.device:
        return self.tensors[0].device

    # -- pipeline ----------------------------------------------------------------------------

    def capture(self) -> list[Graph]:
        """The step's graphs, as the runtime will run them (cached)."""
        if self._captured is None:
            with metadevice.standing_for(self.stands_for), self._as_on_a_device():
                self._captured = capture(
                    self.model,
                    self.example_inputs,
                    self.example_kwargs,
                    autocast=self.autocast,
                    loss=self.loss,
                )
        return [c.graph for c in self._captured]

    def outside_graphs(self) -> list[str]:
        """The names of the trainable parameters that code torch.compile runs eagerly uses,
        where no plan reaches (explorer.eager.parameters_outside_graphs); capturing warns of
        them too."""
        self.capture()
        assert self._captured is not None
        return list(self._captured[0].outside)

    def profile(
        self, progress: ProgressFn | None = None, cancel: CancelToken | None = None
    ) -> StepProfile:
        """Time every operator of every graph on the model's device, then the whole step
        unmodified and under the runtime (explorer.stepcost) (cached)."""
        if self._profile is None:
            timing_seconds()  # a bad $REMAT_EXPLORER_TIMING_SECONDS refused before the capture
        self.capture()
        if self._profile is None and self.device.type == "meta":
            raise UserError(
                "a model on the meta device cannot be timed: plan it with predicted times "
                "(explorer.costmodel.model_planner or meta_planner, or use_profile with "
                "analytic_profile)"
            )
        if self._profile is None:
            assert self._captured is not None
            runs = self._captured
            total = sum(len(c.graph.nodes) for c in runs if c.same_graph_as is None)
            done = 0
            profiles = []
            for captured in runs:
                if captured.same_graph_as is not None:  # another run of a graph timed already
                    profiles.append(profiles[captured.same_graph_as])
                    continue

                def forward(k: int, _n: int, message: str, base: int = done) -> None:
                    if progress is not None:
                        progress(base + k, total, message)

                profiles.append(profile_graph(captured, progress=forward, cancel=cancel))
                done += len(captured.graph.nodes)
            report(progress, total, total, "timing the step, unmodified and under the runtime")
            with _refusing_a_step_compiled_at_every_call():
                times, peaks = self._step_measurements(cancel, progress, total)
            profiles = [replace(p, eager=e) for p, e in zip(profiles, peaks, strict=True)]
            check_cancel(cancel)
            report(progress, total, total, "measuring the unmodified model's peak")
            unmodified = unmodified_peak(
                self.model,
                self.example_inputs,
                self.example_kwargs,
                autocast=self.autocast,
                loss=self.loss,
                gradients_held=self.gradients_held,
            )
            first = profiles[0]
            self._profile = StepProfile(
                profiles,
                first.device,
                first.device_name,
                step_times=times,
                loss=loss_name(self.loss),
                gradients_held=self.gradients_held,
                unmodified_peak_bytes=unmodified,
            )
        return self._profile

    def _step_measurements(
        self, cancel: CancelToken | None, progress: ProgressFn | None, total: int
    ) -> tuple[StepTimes, list[EagerPeaks]]:
        """The whole step timed unmodified and under the runtime, and the moments of code
        outside the graphs (explorer.stepcost, explorer.eagerpeaks)."""
        runtime, backend = self._timed_runtime()
        wrapped = RematModule.over(
            self.model, backend, runtime, self.example_inputs, self.example_kwargs
        )
        times = measure_step_times(
            self.model,
            self.example_inputs,
            self.example_kwargs,
            autocast=self.autocast,
            runtime=wrapped,
            set_marker=backend.set_marker,
            cancel=cancel,
            loss=self.loss,
        )
        report(progress, total, total, "measuring what code outside the graphs holds")
        return times, self.eager_peaks()

    def eager_peaks(self) -> list[EagerPeaks]:
        """What the step's code outside its graphs holds for a moment, per graph run
        (explorer.eagerpeaks): one step of the runtime without recomputation, as plans run
        it (`_timed_runtime`), measured. On the meta device too, where the step runs on
        shapes alone and allocates nothing: what it would hold is the same count of bytes."""
        runtime, backend = self._timed_runtime()
        assert self._captured is not None
        with self._as_on_a_device():
            return measure_eager_peaks(
                self.model,
                self.example_inputs,
                self.example_kwargs,
                runtime,
                backend.set_marker,
                len(self._captured),
                autocast=self.autocast,
                loss=self.loss,
                gradients_held=self.gradients_held,
                unreached=self._captured[0].unreached,
            )

    def _timed_runtime(self) -> tuple[Callable[..., Any], Recorder]:
        """The compiled step without recomputation that runs each graph as plans do
        (capture.timed_runtime), and its backend: what the profile times and what the
        moments of code outside the graphs are measured on. Measured on the capture's own
        step, a graph's tangents for outputs the loss leaves unread were counted there too,
        which no plan makes (8,192 bytes over the measured peak on a side branch's 4,096
        unread logits). Made once, under the capture's device settings."""
        self.capture()
        assert self._captured is not None
        if self._timed is None:
            with metadevice.standing_for(self.stands_for), self._as_on_a_device():
                self._timed = timed_runtime(self._captured)
        return self._timed

    def _as_on_a_device(self) -> contextlib.AbstractContextManager:
        """On the meta device, composite operators traced as on a real one (their backward
        is lost otherwise: explorer.metadevice); elsewhere nothing."""
        if self.device.type == "meta":
            return metadevice.composites_decomposed()
        return contextlib.nullcontext()

    def use_profile(self, profile: StepProfile) -> None:
        """Plan with a saved profile (from another run or machine) instead of profiling."""
        graphs = self.capture()
        fingerprint = "+".join(g.fingerprint() for g in graphs)
        if profile.fingerprint != fingerprint:
            raise OtherStep(
                f"the profile is for graph {profile.fingerprint}, this model traces to "
                f"{fingerprint}: profile this model again"
            )
        name = loss_name(self.loss)
        if profile.loss != name:  # the same graphs, another step around them
            measured = f"with the loss {profile.loss}" if profile.loss else "without a loss"
            wanted = f"with the loss {name}" if name else "without one"
            raise OtherStep(
                f"the profile was measured for a step {measured}, this planner's step is "
                f"{wanted}: profile it again"
            )
        self._profile = profile
        self._solvers.clear()

    def solver(
        self,
        time_limit: float | None = None,
        progress: ProgressFn | None = None,
        cancel: CancelToken | None = None,
        name: str | None = None,
    ) -> StepSolver:
        """The prepared solvers (one per graph, however many times the step runs it), cached
        per name and time limit. `name` picks one of explorer.solvers.registry ("chain",
        "exact", "table") and makes it the one that sweep() and solve() use from then on."""
        self.solver_name = name or self.solver_name
        key = (self.solver_name, time_limit)
        self._last_key = key
        if key not in self._solvers:
            search_seconds()  # a bad $REMAT_EXPLORER_SEARCH_SECONDS refused before profiling
            profile = self.profile(cancel=cancel)
            graphs = self.capture()
            assert self._captured is not None
            firsts = [k for k, c in enumerate(self._captured) if c.same_graph_as is None]
            # a step of one graph is that graph's simulation, eager moments and all; a graph
            # of several plans its own operators, and the step's timeline adds each run's
            single = len(graphs) == 1
            copies = not self.gradients_held  # autograd adds into held gradients in place
            solvers = [
                make_solver(
                    self.solver_name,
                    graphs[k],
                    replace(
                        profile.graphs[k],
                        eager=profile.graphs[k].eager if single else EagerPeaks(),
                        layout_copies=copies,
                        handed_tangents=self._captured[k].handoff.freed_tangents(),
                    ),
                    time_limit=time_limit,
                    max_stages=self.max_stages,
                    progress=progress,
                    cancel=cancel,
                    cache=self._cache_path(n, len(firsts)),
                )
                for n, k in enumerate(firsts)
            ]
            self._solvers[key] = StepSolver(
                graphs,
                solvers,
                self._static_bytes(),
                [p.workspace for p in profile.graphs],
                [c.handoff for c in self._captured],
                runtime_factor=profile.runtime_factor,
                runtime_seconds=profile.runtime_seconds,
                graph_seconds=profile.graph_seconds,
                moments=[p.eager for p in profile.graphs],
                gradients_held=self.gradients_held,
                solver_of=[
                    firsts.index(k if c.same_graph_as is None else c.same_graph_as)
                    for k, c in enumerate(self._captured)
                ],
            )
        return self._solvers[key]

    def _prepared(self, cancel: CancelToken | None = None) -> StepSolver:
        """The solver last prepared (its baseline and timelines are every solver's), or the
        default one: exporting after `sweep(time_limit=30)` prepares nothing again."""
        if self._last_key is not None and self._last_key in self._solvers:
            return self._solvers[self._last_key]
        return self.solver(cancel=cancel)

    def _cache_path(self, k: int, graphs: int) -> Path | None:
        """Graph k's solver cache: `solver_cache`, one file per graph when there are several."""
        if self.solver_cache is None or graphs == 1:
            return self.solver_cache
        return self.solver_cache.with_name(f"{self.solver_cache.stem}_g{k + 1}.json")

    def _static_bytes(self) -> int:
        """Parameters, buffers, tensors kept as module attributes, constants and the user's
        inputs, each storage once: all the model holds, whether the step reads it or not
        (transformers' Llama keeps its rotary embedding's `original_inv_freq` beside the
        `inv_freq` its step reads; a head left unused is more). Verify measures them all.
        A graph's input that eager code made is not among them: it is handed over
        (explorer.capture, `Handoff.transient_inputs`)."""
        self.capture()
        assert self._captured is not None
        static = [*self.tensors, *held_state(self.model)]
        for captured in self._captured:
            static += captured.state_tensors()
        return tensor_bytes(static)

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
        with solver.cancelled_by(cancel):
            found = sweep_budgets(
                solver, points, progress=progress, on_point=self._attach(on_point), cancel=cancel
            )
        for point in found:
            point.schedule.context = self
        setup = solver.setup.to_dict()
        setup["device"] = self._profile.device_name if self._profile else ""
        setup["time_limit"] = time_limit  # the solver's, for a search of the front's budgets
        if self._profile and self._profile.device.startswith(PREDICTED):  # sweep --plan-for
            setup["plan_for"] = self._profile.device.removeprefix(PREDICTED)
        times = self._profile.step_times if self._profile else None
        return Front(
            model=self.made_for(),
            fingerprint=solver.fingerprint,
            baseline_peak_bytes=solver.baseline.predicted_peak_bytes,
            baseline_step_seconds=solver.baseline.predicted_seconds,
            fixed_bytes=solver.fixed_bytes,
            points=found,
            setup=setup,
            runtime_factor=solver.runtime_factor,
            peak_floor_bytes=solver.peak_floor(),
            unmodified_peak_bytes=self._unmodified_peak(),
            unread_gradient_bytes=self._captured[0].unread_gradient_bytes if self._captured else 0,
            unmodified_faults=times.eager_faults if times else None,
            unmodified_step_seconds=times.eager_seconds if times else None,
            runtime_graph_seconds=times.graph_seconds if times else None,
            timing_spread=times.spread if times else None,
            context=self,
        )

    def _unmodified_peak(self) -> int | None:
        """The profile's measured peak of the model as it is, where it was measured for this
        planner's step (a profile from a step without held gradients measured another)."""
        profile = self._profile
        if profile is None or profile.gradients_held != self.gradients_held:
            return None
        return profile.unmodified_peak_bytes

    def _attach(self, on_point):
        if on_point is None:
            return None

        def forward(point) -> None:
            point.schedule.context = self
            on_point(point)

        return forward

    def solve(
        self,
        budget: int | str | float,
        time_limit: float | None = None,
        cancel: CancelToken | None = None,
    ) -> Schedule:
        """The fastest schedule within `budget`: bytes, "4GB", or a fraction (see
        explorer.units.parse_budget: 0.5 keeps half of the activation memory). Asked by
        itself, a budget of a step too large to refine every budget of a sweep is searched
        longer than a sweep's (explorer.solve.LARGE_ALONE_SECONDS). Without `time_limit`, the
        solver last prepared answers (a sweep's, whatever its time limit: it knows the
        front's schedules, so no point of that front within `budget` is faster). `cancel` stops it
        between CBC runs (Cancelled); what it found so far stays known to later calls."""
        if time_limit is None:  # the sweep's solver: its schedules, no stage ILPs again
            solver = self._prepared(cancel)
        else:
            solver = self.solver(time_limit, cancel=cancel)
        limit = parse_budget(budget, solver.baseline.predicted_peak_bytes, solver.fixed_bytes)
        with solver.cancelled_by(cancel):
            schedule = solver.solve(limit, alone=True)
        schedule.context = self
        return schedule

    def baseline(self) -> Schedule:
        """No recomputation: keep what autograd keeps."""
        schedule = self._prepared().baseline.copy()
        schedule.context = self
        return schedule

    # -- what schedules delegate to ----------------------------------------------------------

    def timeline(self, schedule: Schedule) -> Timeline:
        return self._prepared().timeline(schedule.graphs)

    def made_for(self) -> dict:
        """What an exported schedule records about the model and inputs it was made for."""
        graphs = self.capture()
        spec = self.spec
        return {
            "model": {
                "name": spec.name if spec else type(self.model).__name__,
                "batch_size": (
                    spec.batch_size
                    if spec
                    else inputs_batch(self.example_inputs, self.example_kwargs)
                ),
                "input_size": spec.input_size if spec else None,
                "buildable": spec is not None,
            },
            "inputs": _describe_inputs(self.example_inputs, self.example_kwargs),
            "input_signature": input_signature(self.example_inputs, self.example_kwargs),
            "autocast": str(self.autocast) if self.autocast else None,
            "gradients_held": self.gradients_held,
            "loss": loss_name(self.loss),
            "parameters": parameter_signature(self.model),
            "fingerprints": [g.fingerprint() for g in graphs],
            "device": self.stands_for if self.device.type == "meta" else str(self.device),
            "seed": 0,
            "static_bytes": tensor_bytes([*self.model.parameters(), *self.model.buffers()])
            + tensor_bytes(self.tensors),
            "baseline_peak_bytes": self._prepared().baseline.predicted_peak_bytes,
        }

    def export(self, schedule: Schedule, path: str | Path, *, force: bool = False) -> Path:
        return write_module(schedule, self.made_for(), path, force=force)

    def verify_schedule(self, schedule: Schedule, device: str | None = None, path=None):
        from explorer.verify import verify

        if self.device.type == "meta":
            raise UserError(
                "a planner on the meta device runs nothing: export the schedule and run "
                f"`remat-explorer verify` on the {self.stands_for} device it is for"
            )
        if device is not None and torch.device(device) != self.device:
            raise UserError("verify on another device: export and run `remat-explorer verify`")
        if path is None:  # a temporary folder of its own, removed once verified
            with tempfile.TemporaryDirectory(prefix="remat_verify_") as folder:
                return self.verify_schedule(schedule, path=Path(folder) / "schedule.py")
        written = self.export(schedule, path)  # replaces a schedule file, never another file
        return verify(
            written,
            model=self.model,
            example_inputs=self.example_inputs,
            example_kwargs=self.example_kwargs,
            autocast=self.autocast,
            loss=self.loss,
        )


@contextlib.contextmanager
def _refusing_a_step_compiled_at_every_call() -> Iterator[None]:
    """Turn Dynamo's recompile limit, reached while the planner runs the step again, into a
    UserError: the model's Python takes another path at every call, so no plan of one
    step's graphs holds for the next (transformers' BigBird with block-sparse attention draws
    its random blocks in Python: 64 recompilations within its first steps). The profile's
    timed runtime is a wrapped model (explorer.stepcost), which says so in its own error."""
    try:
        yield
    except (torch._dynamo.exc.FailOnRecompileLimitHit, RecompileLimitReached) as exc:
        raise UserError(CAPTURED_AT_EVERY_CALL) from exc


def _stood_for(device: torch.device, stands_for: str | None) -> str:
    """The kind of device a plan is for: the model's own, or on the meta device the one it
    stands for (CUDA unless told)."""
    if stands_for not in (None, "cuda", "cpu"):
        raise UserError(f"stands_for must be 'cuda' or 'cpu', not {stands_for!r}")
    if device.type != "meta":
        if stands_for not in (None, device.type):
            raise UserError(
                f"stands_for={stands_for!r} is for a model on the meta device; this one is "
                f"on {device.type}"
            )
        return device.type
    return stands_for or "cuda"


def _describe_inputs(args: tuple, kwargs: dict) -> dict:
    """Shapes and dtypes of the example inputs (what the plan's sizes were computed for)."""

    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return {"shape": list(x.shape), "dtype": str(x.dtype)}
        return repr(x)

    return {"args": [one(a) for a in args], "kwargs": {k: one(v) for k, v in kwargs.items()}}
