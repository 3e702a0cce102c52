"""Check an exported schedule against the unmodified model, on the same inputs and seed.

Two copies of the model start identical. Each runs one training step: forward with the same
RNG seed (so dropout draws the same masks), then backward from the same random tangents
(gradients of the outputs). We compare outputs, every parameter gradient and every buffer
(BatchNorm running statistics and counters) after the step. Equal means bitwise equal or,
where the arithmetic may differ, `torch.allclose(rtol=1e-5, atol=1e-5 * max|reference|)`;
the report says which. Memory is measured: on CPU with a live-tensor-bytes tracker, on GPU
with `torch.cuda.max_memory_allocated`; both plus the static bytes (parameters, buffers,
inputs), the same quantity the planner predicts. Step times are medians of interleaved runs.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import sys
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from explorer.errors import UserError
from explorer.export import read_module
from explorer.memory import LiveBytesTracker, tensor_bytes, time_step
from explorer.units import format_bytes

RTOL = 1e-5
ATOL_SCALE = 1e-5
TIMED_STEPS = 3


@dataclass
class VerifyRow:
    quantity: str
    measured: Any
    predicted: Any
    ok: bool
    note: str = ""


@dataclass
class VerifyReport:
    path: str
    ok: bool
    rows: list[VerifyRow] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"path": self.path, "ok": self.ok, "rows": [asdict(r) for r in self.rows]}

    def format_table(self) -> str:
        width = max(len(r.quantity) for r in self.rows)
        lines = [f"{'check':<{width}}  {'measured':>16}  {'predicted':>16}  ok   note"]
        for r in self.rows:
            lines.append(
                f"{r.quantity:<{width}}  {_show(r.measured):>16}  {_show(r.predicted):>16}  "
                f"{'yes' if r.ok else 'NO ':<4} {r.note}"
            )
        lines.append("verdict: " + ("equal and within budget" if self.ok else "FAILED"))
        return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def load_wrap(path: Path):
    """Import an exported schedule module (the way a training script would)."""
    name = f"_remat_schedule_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    if not callable(getattr(module, "wrap", None)):
        raise UserError(f"{path}: defines no wrap(model)")
    return module.wrap


def training_step(model: nn.Module, inputs: tuple, seed: int) -> list[torch.Tensor]:
    """One training step from the seed: forward (dropout seeded), backward from random tangents."""
    torch.manual_seed(seed)
    outputs = [o for o in tree_flatten(model(*inputs))[0] if isinstance(o, torch.Tensor)]
    differentiable = [o for o in outputs if o.requires_grad]
    gen = torch.Generator(device=differentiable[0].device).manual_seed(seed + 1)
    tangents = [
        torch.randn(o.shape, dtype=o.dtype, device=o.device, generator=gen) for o in differentiable
    ]
    torch.autograd.backward(differentiable, tangents)
    return [o.detach() for o in outputs]


def _compare(name: str, pairs: list[tuple[torch.Tensor | None, torch.Tensor | None]]) -> VerifyRow:
    bitwise, worst, ok = True, 0.0, True
    for ref, got in pairs:
        if ref is None or got is None:
            if (ref is None) != (got is None):
                ok = bitwise = False
            continue
        if ref.shape != got.shape or ref.dtype != got.dtype:
            ok = bitwise = False
            continue
        if torch.equal(ref, got):
            continue
        bitwise = False
        if ref.is_floating_point():
            diff = (ref.double() - got.double()).abs().max().item()
            worst = max(worst, diff)
            scale = ref.abs().max().item()
            ok &= torch.allclose(got, ref, rtol=RTOL, atol=ATOL_SCALE * max(scale, 1e-12))
        else:
            ok = False
    measured = "bitwise equal" if bitwise else f"max |diff| {worst:.2e}"
    note = f"{len(pairs)} tensors" + ("" if bitwise else f"; rtol {RTOL}, atol {ATOL_SCALE}*max")
    return VerifyRow(name, measured, "equal", ok, note)


def verify(
    path: str | Path,
    device: str | None = None,
    *,
    model: nn.Module | None = None,
    example_inputs: tuple | None = None,
    seed: int = 0,
) -> VerifyReport:
    """Run the exported module and the unmodified model side by side (see module docstring).

    Without `model`, the model is rebuilt from the SPEC recorded in the file.
    """
    path = Path(path)
    made_for, schedule = read_module(path)
    wrap = load_wrap(path)
    reference, inputs = _models(made_for, model, example_inputs, device, seed)
    candidate = copy.deepcopy(reference)
    wrapped = wrap(candidate)
    static = tensor_bytes([*reference.parameters(), *reference.buffers(), *inputs])
    dev = inputs[0].device

    with LiveBytesTracker(dev) as ref_meter:
        ref_out = training_step(reference, inputs, seed)
    with _out_of_memory_explained(schedule), LiveBytesTracker(dev) as new_meter:
        new_out = training_step(wrapped, inputs, seed)

    rows = [
        _compare("outputs", list(zip(ref_out, new_out, strict=False))),
        _compare(
            "parameter gradients",
            [
                (a.grad, b.grad)
                for a, b in zip(reference.parameters(), candidate.parameters(), strict=True)
            ],
        ),
        _compare(
            "buffers (BatchNorm statistics)",
            list(zip(reference.buffers(), candidate.buffers(), strict=True)),
        ),
    ]
    rows += _memory_rows(static, ref_meter.peak_bytes, new_meter.peak_bytes, schedule, made_for)
    if new_meter.peak_reserved_bytes is not None:
        rows.append(
            VerifyRow(
                "CUDA reserved peak (bytes)",
                new_meter.peak_reserved_bytes,
                int(schedule.get("predicted_peak_bytes", 0)),
                True,
                "what the caching allocator held: fragmentation shows here",
            )
        )
    rows += _time_rows(reference, wrapped, inputs, seed, schedule)
    ok = all(r.ok for r in rows)
    return VerifyReport(str(path), ok, rows)


@contextlib.contextmanager
def _out_of_memory_explained(schedule: dict):
    """A CUDA OOM under a schedule whose predicted peak fits is the caching allocator's
    fragmentation: say so, with the remedy, in one line."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        peak = format_bytes(int(schedule.get("predicted_peak_bytes", 0)))
        raise UserError(
            f"CUDA ran out of memory although the schedule needs {peak}: the caching "
            "allocator is fragmented; rerun with "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        ) from exc


def _models(made_for: dict, model, example_inputs, device, seed):
    if model is not None:
        if example_inputs is None:
            raise UserError("verify(model=...) needs example_inputs too")
        inputs = (
            tuple(example_inputs)
            if isinstance(example_inputs, (tuple, list))
            else (example_inputs,)
        )
        return copy.deepcopy(model).train(), inputs
    from explorer.models import build

    spec = made_for.get("model", {})
    if not spec.get("buildable"):
        raise UserError(
            f"this schedule was made for a model without a SPEC ({spec.get('name')}): "
            "verify it from Python with explorer.verify(path, model=..., example_inputs=...)"
        )
    built = build(
        spec["name"],
        spec["batch_size"],
        spec.get("input_size"),
        device or made_for.get("device", "cpu"),
        seed=made_for.get("seed", 0),
    )
    return built.model, built.example_inputs


def _memory_rows(static, ref_peak, new_peak, schedule, made_for) -> list[VerifyRow]:
    measured = static + new_peak
    predicted = int(schedule.get("predicted_peak_bytes", 0))
    budget = schedule.get("budget_bytes")
    error = (measured - predicted) / predicted if predicted else 0.0
    within = budget is None or measured <= budget
    note = f"{error:+.2%} vs predicted"
    if budget is not None:
        note += f"; budget {format_bytes(budget)}"
    return [
        VerifyRow("peak memory (bytes)", measured, predicted, within, note),
        VerifyRow(
            "unmodified model peak (bytes)",
            static + ref_peak,
            int(made_for.get("baseline_peak_bytes", 0)),
            True,
            f"schedule saves {1 - measured / max(static + ref_peak, 1):.1%}",
        ),
    ]


def _time_rows(reference, wrapped, inputs, seed, schedule) -> list[VerifyRow]:
    ref_times, new_times = [], []
    for _ in range(TIMED_STEPS):  # interleaved, so drifts in machine load hit both alike
        ref_times.append(
            time_step(lambda: training_step(reference, inputs, seed), inputs[0].device)
        )
        new_times.append(time_step(lambda: training_step(wrapped, inputs, seed), inputs[0].device))
    ref_s, new_s = sorted(ref_times)[TIMED_STEPS // 2], sorted(new_times)[TIMED_STEPS // 2]
    predicted_overhead = (
        float(schedule.get("predicted_seconds", 0))
        / max(float(schedule.get("baseline_seconds", 0)), 1e-12)
        - 1
    )
    return [
        VerifyRow(
            "step seconds",
            new_s,
            float(schedule.get("predicted_seconds", 0.0)),
            True,
            f"unmodified model {ref_s:.4g} s",
        ),
        VerifyRow(
            "overhead",
            new_s / ref_s - 1,
            predicted_overhead,
            True,
            "measured against the unmodified model, median of interleaved steps",
        ),
    ]
