"""The Dashboard: every widget wired to one Planner, for notebooks and the Voila app."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import ipywidgets as ipw
import torch

from explorer import CancelToken, Planner, UserError, peers
from explorer.modelstate import tensors_in
from remat_explorer.widgets.budget import BudgetSlider
from remat_explorer.widgets.choice import Choice
from remat_explorer.widgets.export import ExportPanel, module_file_name
from remat_explorer.widgets.model_picker import ModelPicker
from remat_explorer.widgets.pareto import ParetoPlot
from remat_explorer.widgets.status import StatusLine
from remat_explorer.widgets.tasks import ProgressFn, TaskRunner
from remat_explorer.widgets.timeline import TimelinePlot
from remat_explorer.widgets.units import format_bytes
from remat_explorer.widgets.verify import VerifyPanel


class Dashboard(ipw.VBox):
    """Profile, sweep, pick a budget, look at the timeline, export and verify, on one page.

    `Dashboard(model, example_input)` plans your own `nn.Module` (the model picker only
    names it); `Dashboard(spec="resnet18", batch_size=8)` or `Dashboard()` lets the picker
    choose among `explorer.models.list_specs()`, built with `explorer.models.build`. The
    dashboard holds no planning logic: each button calls the `Planner` in a worker thread and
    the widgets draw what its callbacks report. `peers=False` skips measuring
    `explorer.peers` after a sweep (they run real training steps, which takes a while).
    """

    def __init__(
        self,
        model: Any = None,
        example_input: Any = None,
        *,
        spec: str | None = None,
        batch_size: int = 8,
        input_size: int | None = None,
        device: str | None = None,
        points: int = 12,
        time_limit: float | None = None,
        peers: bool = True,
        export_dir: str | Path = ".",
    ) -> None:
        if (model is None) != (example_input is None):
            raise UserError("pass both a model and its example input, or neither")
        self.points = points
        self.time_limit = time_limit
        self.measure_peers = peers
        self.planner: Any = None
        self.front: Any = None
        self._own_model = None if model is None else (model, _as_tuple(example_input))
        self._target: tuple[Any, tuple] | None = self._own_model
        self._key: tuple | None = None
        self._baseline: Any = None

        self.status = StatusLine()
        self.runner = TaskRunner(self.status)
        self.picker = ModelPicker(spec, batch_size, input_size, device)
        # where the caller's model runs and at what batch (None: no batch dimension)
        self._runs_on = None if self._own_model is None else _runs_on(self._own_model[1])
        if self._runs_on is not None:
            self.picker.lock(f"{type(model).__name__} (your model)", *self._runs_on)
        self.profile_button = ipw.Button(
            description="Profile", icon="stopwatch", button_style="primary"
        )
        self.profile_button.add_class("remat-profile")
        self.sweep_button = ipw.Button(
            description="Sweep", icon="chart-line", button_style="primary"
        )
        self.sweep_button.add_class("remat-sweep")
        self.pareto = ParetoPlot()
        self.budget = BudgetSlider(runner=self.runner)
        self.timeline = TimelinePlot()
        self.export_panel = ExportPanel(directory=export_dir, status=self.status)
        # your own model has no SPEC to rebuild it from: verify against it and its inputs
        self.verify_panel = VerifyPanel(runner=self.runner, against=self._own_model)

        self.profile_button.on_click(self.status.guard(lambda _: self.profile()))
        self.sweep_button.on_click(self.status.guard(lambda _: self.sweep()))
        self.budget.on_select(self.status.guard(self._select))
        self.export_panel.on_export(self.verify_panel.set_path)
        self.runner.observe(lambda _: self._enable(), "busy")

        super().__init__(
            [
                self.picker,
                ipw.HBox(
                    [
                        self.profile_button,
                        self.sweep_button,
                        self.runner.cancel_button,
                        self.runner.progress,
                    ]
                ),
                self.status,
                ipw.HBox(  # side by side where there is room, else one under the other
                    [
                        ipw.VBox([self.pareto, self.budget], layout={"width": "620px"}),
                        ipw.VBox(
                            [self.timeline, self.export_panel, self.verify_panel],
                            layout={"width": "620px"},
                        ),
                    ],
                    layout={"flex_flow": "row wrap", "grid_gap": "12px"},
                ),
            ]
        )
        self.add_class("remat-dashboard")
        self.status.info("choose a model, then Profile (or go straight to Sweep)")

    def profile(self) -> bool:
        """Profile the chosen model in the background; False if another job is running."""
        return self.runner.start("profile", self._run_profile, self._show_profile)

    def sweep(self) -> bool:
        """Sweep budgets in the background (profiling first if needed); points appear live."""
        return self.runner.start("sweep", self._run_sweep, self._show_sweep)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the running job ends; True if it did.

        For scripts and tests. In a notebook the widgets catch up once the cell returns: the
        kernel applies widget updates between cells (see `TaskRunner.ui`).
        """
        return self.runner.wait(timeout)

    def _run_profile(self, progress: ProgressFn, cancel: CancelToken) -> Any:
        planner = self._planner()
        planner.profile(progress=progress, cancel=cancel)
        return planner.baseline()

    def _show_profile(self, baseline: Any) -> None:
        self._baseline = baseline
        self.pareto.set_baseline(baseline.predicted_peak_bytes)
        self.timeline.set_baseline(baseline)
        self.budget.attach(self.planner)
        planned = self.planner.device.type == "meta"  # for a device, with predicted times
        made = f"predicted for {self.planner.profile().device_name}" if planned else "profiled"
        self.status.ok(
            f"{made}: no-recompute peak {format_bytes(baseline.predicted_peak_bytes)}; now Sweep"
            f"{self._caveats()}"
        )

    def _caveats(self) -> str:
        """What the plan cannot reach (layers torch.compile runs eagerly) and what a plan on the
        meta device cannot make exact (explorer.costmodel.meta_caveats), for the end of a
        status line; empty when nothing."""
        from explorer.capture import outside_graphs_note
        from explorer.costmodel import meta_caveats

        outside = outside_graphs_note(self.planner.outside_graphs(), self.planner.model)
        caveats = [outside] if outside else []
        return "".join(f"; note: {c}" for c in [*caveats, *meta_caveats(self.planner)])

    def _run_sweep(self, progress: ProgressFn, cancel: CancelToken) -> tuple[Any, float, list[str]]:
        ui = self.runner.ui
        started = time.monotonic()
        if self._baseline is None or self._key != self._current_key():
            ui(self._show_profile, self._run_profile(progress, cancel))
        ui(self._forget_points)
        front = self.planner.sweep(
            points=self.points,
            time_limit=self.time_limit,
            progress=progress,
            on_point=lambda point: ui(self._on_point, point),
            cancel=cancel,
        )
        seconds = time.monotonic() - started
        self.front = front
        not_measured: list[str] = []
        if self.measure_peers and self.planner.device.type == "meta":
            not_measured = [f"nothing runs for {self.planner.profile().device_name}"]
        elif self.measure_peers:
            model, inputs = self._target
            progress(0, 1, "measuring torch.utils.checkpoint peers")
            peer_points = peers.measure(
                model,
                inputs,
                progress=progress,
                cancel=cancel,
                loss=self.planner.loss,
                gradients_held=self.planner.gradients_held,
            )
            ui(self.pareto.set_peers, peer_points)
            not_measured = [
                f"{p.name} ({p.detail})" for p in peer_points if math.isnan(p.step_seconds)
            ]
        return front, seconds, not_measured

    def _show_sweep(self, result: tuple[Any, float, list[str]]) -> None:
        front, seconds, not_measured = result
        # every solved budget was drawn as it came; keep the Pareto-optimal ones (same objects)
        pareto = {id(point.schedule) for point in front.points}
        keep = [c for c in self.budget.choices if c.on_demand or id(c.schedule) in pareto]
        self.pareto.keep_only(keep)
        self.budget.keep_only(keep)
        note = f"; peers not measured: {', '.join(not_measured)}" if not_measured else ""
        pick = front.nothing_lower() or "move the budget slider to pick one"
        notes = "".join(f"; {n}" for n in front.notes())
        count = len(front.points)
        self.status.ok(
            f"swept {count} Pareto point{'s' if count != 1 else ''} in {seconds:.1f} s; "
            f"{pick}{note}{notes}{self._caveats()}"
        )

    def _on_point(self, point: Any) -> None:
        choice = Choice.from_point(point)
        self.pareto.add(choice)
        self.budget.add(choice)

    def _select(self, choice: Choice) -> None:
        if choice.on_demand and choice not in self.pareto.choices:
            self.pareto.add(choice)
        self.pareto.select(choice)
        if choice.schedule is None:
            raise UserError("this point has no schedule; solve its budget to use it")
        self.timeline.show(choice.schedule)
        name = self.picker.spec.value if self._own_model is None else "model"
        file_name = module_file_name(name, choice.peak_bytes, self.export_panel.directory)
        self.export_panel.set_schedule(choice.schedule, file_name)

    def _current_key(self) -> tuple:
        if self._own_model is not None:
            picked = self.picker
            fields = (picked.device.value, picked.batch_size.value, picked.precision.value)
            return ("own", *fields, *picked.backward_key())
        return (*self.picker.settings(), *self.picker.backward_key())

    def _planner(self) -> Any:
        """The Planner for the current settings: a new one (and empty plots) when they changed.

        Runs in the worker: building a model takes a while.
        """
        key = self._current_key()
        if self.planner is not None and key == self._key:
            return self.planner
        if self._own_model is None and self.picker.plan_for():
            self.planner = self._meta_planner()
            self._target = None  # the last model's: nothing runs for this one
            self.verify_panel.device = self.planner.stands_for
        elif self._own_model is None:
            built = self.picker.build()
            self._target = (built.model, built.example_inputs)
            self.planner = Planner(
                built.model,
                built.example_inputs,
                built.example_kwargs,
                spec=built.spec,
                **self.picker.step_options(),
            )
            self.verify_panel.device = key[3]
        else:
            self.planner = self._own_planner()
        self._key = key
        self._baseline = None
        self.front = None
        self.runner.ui(self._start_over)
        return self.planner

    def _meta_planner(self) -> Any:
        """A planner for a device this machine need not have: the step captured on the meta
        device, its times predicted (explorer.costmodel.meta_planner), as `sweep --plan-for`."""
        from explorer.costmodel import meta_planner

        spec, batch_size, input_size, _device, _precision = self.picker.settings()
        options = self.picker.step_options()
        _refuse_autocast(options)
        return meta_planner(
            spec,
            batch_size,
            input_size,
            self.picker.plan_for(),
            loss=options["loss"],
            gradients_held=options["gradients_held"],
        )

    def _own_planner(self) -> Any:
        """A planner of the caller's model: where it runs, at its inputs' batch, or for a
        device chosen by name at any batch (explorer.costmodel.model_planner: nothing runs).
        Verify runs it against that model and inputs when the plan is for them."""
        from explorer.costmodel import model_planner

        model, inputs = self._own_model
        runs_on, batch = self._runs_on
        chosen = batch if batch is None else self.picker.batch_size.value
        options = self.picker.step_options()
        device_name = self.picker.plan_for()
        if device_name is None:
            if chosen != batch:
                raise UserError(
                    f"your model's example input has batch {batch}: to plan batch {chosen}, "
                    "choose a 'plan for' device (nothing runs)"
                )
            self.verify_panel.refusal = None
            return Planner(model, inputs, **options)
        _refuse_autocast(options)
        planner = model_planner(
            model,
            inputs,
            device_name=device_name,
            batch_size=chosen,
            loss=options["loss"],
            gradients_held=options["gradients_held"],
        )
        here = planner.stands_for == torch.device(runs_on).type and chosen == batch
        self.verify_panel.refusal = None if here else (
            f"this plan is for a {planner.stands_for} device at batch {chosen}: verify its "
            "export there, with explorer.verify(path, model=..., example_inputs=...)"
        )  # fmt: skip
        return planner

    def _start_over(self) -> None:
        self._forget_points()
        self.timeline.clear()
        self.budget.attach(None)

    def _forget_points(self) -> None:
        self.pareto.clear()
        if self._baseline is not None:
            self.pareto.set_baseline(self._baseline.predicted_peak_bytes)
        self.budget.clear()
        self.export_panel.set_schedule(None)

    def _enable(self) -> None:
        self.profile_button.disabled = self.runner.busy
        self.sweep_button.disabled = self.runner.busy


def _refuse_autocast(options: dict) -> None:
    """A step planned for a device is planned in fp32: autocast casts nothing on the meta
    device, so the plan would be of another step than the one that runs."""
    if options["autocast"] is not None:
        raise UserError("planning for a device uses predicted fp32 times: choose fp32")


def _runs_on(inputs: tuple) -> tuple[str, int | None]:
    """The device the caller's inputs are on, and their batch: the first tensor's first
    dimension (None when it has none)."""
    tensors = tensors_in(inputs)
    if not tensors:
        raise UserError("the example inputs hold no tensor: pass a tensor or a tuple of them")
    first = tensors[0]
    return str(first.device), (first.shape[0] if first.dim() else None)


def _as_tuple(example_input: Any) -> tuple:
    return tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
