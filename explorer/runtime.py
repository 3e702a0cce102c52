"""Run a model's training step the way a schedule says: the module an exported file returns.

`wrap_with_schedule(model, made_for, schedule)` re-traces the model (fake tensors, no real
compute), checks that the trace has the fingerprint the schedule was made for, and returns a
module whose forward runs every forward operator once (keeping only the schedule's saved
tensors) and whose backward runs the schedule's backward list, recomputing as it goes.

Contract, for users of the wrapped module:
- gradients land in the original parameters' `.grad` (the wrapped module owns the original
  model as `.model`, so optimizers, `state_dict` and DistributedDataParallel see the same
  parameters);
- BatchNorm running statistics are updated once per forward, as in the unmodified model: the
  buffer updates are forward-only operators, never part of a recomputation;
- random operators (dropout) run once, in the forward, in the model's own order, so with the
  same seed they draw the same masks; a schedule always keeps their outputs, never recomputes
  them;
- in eval mode, or with gradients disabled, the model runs unchanged;
- inputs must have the shapes and dtypes the schedule was made for, otherwise a UserError.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_unflatten

from explorer.capture import Capture, capture
from explorer.errors import UserError
from explorer.execute import Slots, compile_steps, op_table, run
from explorer.graph import ROLE_BUFFER, ROLE_PARAM
from explorer.program import StepProgram, compile_program
from explorer.schedule import Schedule


def _is_float(dtype: str) -> bool:
    return "float" in dtype or "complex" in dtype


class StepRunner:
    """A captured step plus a compiled program for one device."""

    def __init__(self, cap: Capture, schedule: Schedule) -> None:
        self.capture = cap
        self.program: StepProgram = compile_program(cap.graph, schedule)
        ops = op_table(cap.fx_graph)
        self.forward_steps = compile_steps(self.program.forward, ops)
        self.backward_steps = compile_steps(self.program.backward, ops)
        graph = cap.graph
        self.param_count = len(graph.placeholders(ROLE_PARAM))
        self.diff_outputs = [
            i
            for i, ref in enumerate(graph.model_outputs)
            if ref is not None and _is_float(graph.meta(ref).dtype)
        ]

    def fresh_slots(self, static: list[torch.Tensor]) -> Slots:
        slots: Slots = [None] * len(self.program.slot_of)
        for slot, tensor in zip(self.program.static_slots, static, strict=True):
            slots[slot] = tensor
        return slots


class _RematStep(torch.autograd.Function):
    """Forward and backward of the whole model as one autograd node."""

    @staticmethod
    def forward(ctx: Any, runner: StepRunner, buffers: list[torch.Tensor], *flat: torch.Tensor):
        params = list(flat[: runner.param_count])
        inputs = list(flat[runner.param_count :])
        static = [*params, *buffers, *inputs]
        slots = runner.fresh_slots(static)
        run(runner.forward_steps, slots)
        ctx.runner = runner
        ctx.static = static
        ctx.saved = {s: slots[s] for s in runner.program.saved_slots}
        outputs = tuple(slots[s] for s in runner.program.output_slots)
        non_diff = [o for i, o in enumerate(outputs) if i not in runner.diff_outputs]
        if non_diff:
            ctx.mark_non_differentiable(*non_diff)
        return outputs

    @staticmethod
    def backward(ctx: Any, *grad_outputs: torch.Tensor):
        runner: StepRunner = ctx.runner
        program = runner.program
        slots = runner.fresh_slots(ctx.static)
        saved, ctx.saved = ctx.saved, None  # the slots become the only owners: frees are real
        _fill_backward_slots(slots, program, runner.diff_outputs, saved, grad_outputs)
        del saved
        run(runner.backward_steps, slots)
        grads = [None if s is None else slots[s] for s in program.grad_slots[: runner.param_count]]
        n_buffers = len(runner.capture.graph.placeholders(ROLE_BUFFER))
        n_inputs = len(ctx.static) - runner.param_count - n_buffers
        return (None, None, *grads, *([None] * n_inputs))


def _fill_backward_slots(
    slots: Slots,
    program: StepProgram,
    diff_outputs: list[int],
    saved: dict[int, torch.Tensor],
    grad_outputs: tuple[torch.Tensor, ...],
) -> None:
    """Put saved tensors and tangents into their slots. A function of its own so that no loop
    variable in the caller's frame keeps a tensor alive after its slot is cleared."""
    for slot, tensor in saved.items():
        slots[slot] = tensor
    for slot, i in zip(program.tangent_slots, diff_outputs, strict=True):
        grad = grad_outputs[i]
        slots[slot] = grad if grad.is_contiguous() else grad.contiguous()
    for slot in program.unread_saved:
        slots[slot] = None


def _describe(made_for: dict) -> str:
    model = made_for.get("model", {})
    return f"{model.get('name', 'a model')} (batch {model.get('batch_size')})"


class RematModule(nn.Module):
    """The user's model, trained under a rematerialization schedule."""

    def __init__(self, model: nn.Module, made_for: dict, schedule: Schedule) -> None:
        super().__init__()
        self.model = model
        self.made_for = made_for
        self.schedule = schedule
        self._runners: dict[str, StepRunner] = {}
        self.runner_for(self._placeholder_inputs())  # trace now: a wrong model fails here

    def _placeholder_inputs(self) -> tuple[torch.Tensor, ...]:
        """Empty tensors shaped like the inputs the schedule was made for, on the model's
        device: tracing only needs their shapes."""
        first = next(iter(self.model.parameters()), None)
        device = first.device if first is not None else torch.device("cpu")
        return tuple(
            torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")), device=device)
            for shape, dtype in zip(
                self.made_for["input_shapes"], self.made_for["input_dtypes"], strict=True
            )
        )

    def runner_for(self, inputs: tuple[torch.Tensor, ...]) -> StepRunner:
        """Trace (once per device) and check the trace is the one the schedule was made for."""
        self._check_inputs(inputs)
        device = str(inputs[0].device) if inputs else "cpu"
        if device not in self._runners:
            cap = capture(self.model, inputs)
            found = cap.graph.fingerprint()
            if found != self.schedule.fingerprint:
                raise UserError(
                    f"this schedule was made for {_describe(self.made_for)} with graph "
                    f"{self.schedule.fingerprint}, but this model traces to {found}: "
                    "export a schedule for this model"
                )
            self._runners[device] = StepRunner(cap, self.schedule)
        return self._runners[device]

    def _check_inputs(self, inputs: tuple[torch.Tensor, ...]) -> None:
        shapes = [list(s) for s in self.made_for["input_shapes"]]
        dtypes = list(self.made_for["input_dtypes"])
        got_shapes = [list(x.shape) for x in inputs]
        got_dtypes = [str(x.dtype) for x in inputs]
        if got_shapes != shapes or got_dtypes != dtypes:
            raise UserError(
                f"this schedule was made for inputs {shapes} {dtypes}, got {got_shapes} "
                f"{got_dtypes}: export a schedule for this shape"
            )

    def forward(self, *inputs: torch.Tensor) -> Any:
        if not self.training or not torch.is_grad_enabled():
            return self.model(*inputs)
        runner = self.runner_for(inputs)
        params = [p for _, p in self.model.named_parameters()]
        buffers = [b for _, b in self.model.named_buffers()]
        flat = _RematStep.apply(runner, buffers, *params, *inputs)
        return tree_unflatten(list(flat), runner.capture.out_spec)


def wrap_with_schedule(model: nn.Module, made_for: dict, schedule_data: dict) -> RematModule:
    """Wrap `model` so that its training step follows the schedule (see module docstring)."""
    schedule = Schedule.from_dict(schedule_data)
    expected = made_for.get("param_names")
    if expected is not None:
        names = [n for n, _ in model.named_parameters()]
        if names != expected:
            raise UserError(
                f"this schedule was made for {_describe(made_for)}; this model's parameters "
                f"differ ({len(names)} vs {len(expected)} tensors): export a schedule for it"
            )
    return RematModule(model, made_for, schedule)
