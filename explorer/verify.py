"""Check an exported schedule against the unmodified model, on the same inputs and seed.

The exported file is never run: its two literals (what it was made for, and the schedule) are
read with `ast.literal_eval` (explorer.export.read_module) and handed to the runtime
(explorer.backend.wrap_with_schedule), exactly what the file's `wrap()` would do. A file with
anything else in it is verified by its data alone.

Two copies of the model start identical. Each runs one training step: forward with the same RNG
seed (so dropout draws the same masks), then backward from the same random tangents (gradients
of the outputs). Every row of the report is a check that can fail:

- the runtime applied the exported plan itself to every graph (not a carried-over one);
- outputs, every parameter gradient, every input gradient (for inputs that require grad),
  every buffer (BatchNorm statistics and counters) and, where a forward writes into its
  inputs, what it left in them, equal (each step starts from the inputs as given, put back
  after it): bitwise, or where the arithmetic may
  differ, `torch.allclose(rtol=1e-5, atol=1e-5 * max|reference|)`, under autocast `atol` the
  autocast dtype's precision times the largest magnitude in the row (torch.compile rounds a
  bf16 dropout's scaling where eager does not); the row says which. A missing output or
  gradient on either side is a failure;
- where neither holds, the error against the exact answer decides, as PyTorch's own accuracy
  checks of compiled models decide: the same step is run once more in float64 (where the plan
  holds gradients, after a float64 first step of its own: each side's first step is as far
  from the exact one as its second), and each tensor of the schedule must be no further from
  it (root mean square) than `FLOAT64_MULTIPLIER` times the unmodified model's tensor is, plus
  `ATOL_SCALE * max|float64|`. This is what a GPU
  needs: the captured graph runs other kernels than eager PyTorch (BatchNorm's own CUDA kernel
  where eager calls cuDNN's), and convolutions run in TF32, so a correct schedule differs from
  eager in the fourth digit and a wrong one by far more. On CUDA both steps run with
  deterministic kernels (`torch.use_deterministic_algorithms`, cuDNN deterministic), so that
  run-to-run noise (cuDNN's atomic weight gradients) does not enter the comparison;
- where a row is not bitwise equal, the schedule's step against the same step under the
  runtime with nothing recomputed (its schedule's graphs left out, so every graph runs its
  no-recompute plan), from the same state and seed: bitwise equal (on CUDA, within the
  tolerance above: not every kernel has a deterministic version), or the row fails. Both run
  the same captured graphs with the same kernels, and recomputing runs an operator again on
  the same inputs, so a difference there is the schedule's; where this row holds, the rows
  above differ by the compiled graphs' arithmetic, as `torch.compile` with `aot_eager` does
  (transformers' Llama on the CPU: gradients 7.6e-6 apart under either);
- where such a row fails and the two steps, from one seed, left the random generators in
  other states, its note says so: torch.compile leaves out a random operator whose result
  nothing uses (a dropout of an output the model does not return), so every later dropout
  draws another mask, under any plan as under plain torch.compile;
- the measured peak within the budget and within 3% of the predicted peak. Memory is measured on
  CPU with a live-tensor-bytes tracker, on GPU as the bytes requested of the caching allocator
  (`requested_bytes`), both plus the static bytes (parameters, buffers, other tensors the model
  keeps, inputs, and for the schedule's step the constants its compiled graphs hold): the quantity
  the planner predicts. On GPU that step runs with the user's kernel settings, and
  `torch.cuda.max_memory_allocated` (the allocator's rounded blocks) and the reserved peak are
  reported beside it.

The unmodified model's peak, step times and the measured overhead (medians of interleaved steps)
are reported beside the checks, as measurements: they are facts about the machine and eager
PyTorch, not promises of the schedule.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from explorer.backend import EXACT, RematError, module_inside, wrap_with_schedule
from explorer.errors import RematWarning, UserError, first_line
from explorer.export import read_module
from explorer.losses import NAMED
from explorer.memory import LiveBytesTracker, tensor_bytes, time_step
from explorer.modelstate import (
    STEP_SEED,
    InputValues,
    as_trained,
    clear_grads,
    copy_model,
    drew_alike,
    generator_states,
    held_state,
    output_tensors,
    seed_host_generators,
    step_inputs_and_state,
    tensors_in,
)
from explorer.pagefaults import fault_note, faults_of, median_faults
from explorer.progress import CancelToken, check_cancel
from explorer.schedule import Schedule
from explorer.timingrounds import TIMING_SECONDS_VARIABLE, another_round, timing_seconds
from explorer.units import format_bytes

RTOL = 1e-5
ATOL_SCALE = 1e-5
FLOAT64_MULTIPLIER = 2.0  # PyTorch's accuracy checks of compiled models allow the same
PEAK_TOLERANCE = 0.03
BITWISE = "bitwise equal"
# the check of the schedule's step against the runtime's with nothing recomputed
RECOMPUTATION = "against nothing recomputed"
WRITTEN = "inputs written in place"  # the check of what a forward wrote into its inputs
# and into the parameters (nn.Embedding(max_norm=...) renormalizes the rows it looks up)
PARAMETERS_WRITTEN = "parameters written in place"
# the least timed rounds, for a median; more where they fit (explorer.timingrounds)
LEAST_ROUNDS = 3
# the widest spread of the middle half of the timed rounds' overheads (in overhead, 0.10 =
# 10 points) before the table says the measured overhead is not to be trusted: the middle
# half, since the whole range widens with every round timed (sample:unet b2 32 px's 20
# rounds ran from -3.5% to +35.6% where the median moved by a few points)
NOISY_SPREAD = 0.10
LOWEST_ROUND, HIGHEST_ROUND = "overhead, lowest round", "overhead, highest round"
FIRST_QUARTILE, THIRD_QUARTILE = "overhead, first quartile", "overhead, third quartile"
TIMED_ROUNDS = "timed rounds"
STEP_UNMODIFIED = "step seconds, unmodified model"
# medians of the timed steps' minor page faults, on the CPU (explorer.pagefaults)
FAULTS_UNMODIFIED = "page faults a step, unmodified model"
FAULTS_SCHEDULE = "page faults a step, schedule"
# the note on a failed row when the two steps, from one seed, left the generators in other
# states (explorer.capture warns of it when planning)
OTHER_DRAWS = (
    "the wrapped step drew other random numbers than the unmodified one, so its dropout "
    "masks differ: torch.compile leaves out a random operator whose result nothing uses "
    "(or the forward reseeds the generator), under any plan as under torch.compile itself"
)


@dataclass
class VerifyRow:
    """One check: what was measured, what was expected, and whether it holds."""

    quantity: str
    measured: Any
    predicted: Any
    ok: bool
    note: str = ""


@dataclass
class VerifyReport:
    path: str
    rows: list[VerifyRow] = field(default_factory=list)
    measurements: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.rows) and all(r.ok for r in self.rows)

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "ok": self.ok,
            "rows": [asdict(r) for r in self.rows],
            "measurements": self.measurements,
        }

    def format_table(self) -> str:
        width = max(len(r.quantity) for r in self.rows)
        lines = [f"{'check':<{width}}  {'measured':>16}  {'predicted':>16}  ok   note"]
        for r in self.rows:
            lines.append(
                f"{r.quantity:<{width}}  {_show(r.measured):>16}  {_show(r.predicted):>16}  "
                f"{'yes' if r.ok else 'NO ':<4} {r.note}"
            )
        for name, value in self.measurements.items():
            lines.append(f"{name}: {_show(value)}")
        lines += timing_notes(self.measurements)
        lines.append("verdict: " + ("equal and within budget" if self.ok else "FAILED"))
        return "\n".join(lines)


def timing_note(measurements: dict[str, float]) -> str | None:
    """A line saying the measured overhead is not to be trusted, when the middle half of the
    timed rounds' overheads spreads wider than NOISY_SPREAD: the machine's load then moved
    the steps more than the schedule did (efficientnet_b0 measured -34% while two test
    workers ran). None for a report without timings."""
    low, high = measurements.get(FIRST_QUARTILE), measurements.get(THIRD_QUARTILE)
    if low is None or high is None or high - low <= NOISY_SPREAD:
        return None
    return (
        f"timing is noisy: the middle half of the overheads of the "
        f"{measurements[TIMED_ROUNDS]:.0f} timed rounds ran from {low:+.1%} to {high:+.1%}, so "
        f"the measured overhead says little; time again on an idle machine (or give "
        f"{TIMING_SECONDS_VARIABLE} more seconds)"
    )


def faults_note(measurements: dict[str, float]) -> str | None:
    """A line saying how much of the measured overhead the two steps' page faults make, when
    it is a point or more (explorer.pagefaults); None for a report without fault counts."""
    unmodified, schedule = measurements.get(FAULTS_UNMODIFIED), measurements.get(FAULTS_SCHEDULE)
    if unmodified is None or schedule is None:
        return None
    return fault_note(unmodified, schedule, measurements[STEP_UNMODIFIED])


def timing_notes(measurements: dict[str, float]) -> list[str]:
    """What the table says under the measured overhead: that the timing is noisy, and what
    page faults made of it, where either holds."""
    notes = (timing_note(measurements), faults_note(measurements))
    return [note for note in notes if note is not None]


def _show(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def training_step(
    model: nn.Module,
    inputs: tuple,
    seed: int,
    kwargs: dict | None = None,
    tangent_dtype: torch.dtype | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """One training step from the seed: forward (dropout seeded, and NumPy's and Python's
    generators), then, given `loss`, backward from `loss(result)` (the outputs still held, as a loop
    that names them holds them); otherwise backward from random tangents on every output that
    requires grad, but an output that shares its storage with an earlier one (a view of it: CLIP
    returns `logits_per_image` as `logits_per_text.t()`): the graph returns that storage once and
    gets one tangent for it, which the plan counts, where a tangent per view is memory of the
    caller's that no plan sees (16 bytes over CLIP's predicted peak). Returns the outputs, detached,
    in pytree order.

    Tangents are drawn in each output's dtype, or in `tangent_dtype` and then cast (a float64
    run of a float32 model draws the float32 run's tangents).

    Outputs inside objects that pytree does not open count too, after the others: a
    transformers `DynamicCache` (`use_cache=True`) holds each layer's key and value states,
    which the step returns and the plan gives a tangent each, like any output; and every
    tensor there that is neither the model's nor an input, a grad_fn or not, is compared
    (Reformer's cache holds states its custom Function made without one)."""
    torch.manual_seed(seed)
    seed_host_generators(seed)
    result = model(*inputs, **(kwargs or {}))
    tensors = output_tensors(result, lambda: step_inputs_and_state(model, (inputs, kwargs)))
    if loss is not None:
        loss_of(result, loss).backward()
        return [o.detach() for o in tensors]
    differentiable: list[torch.Tensor] = []
    for output in tensors:
        storage = output.untyped_storage()
        if output.requires_grad and all(d.untyped_storage() is not storage for d in differentiable):
            differentiable.append(output)
    if differentiable:
        draw = _tangent_draw(differentiable[0].device, seed + 1)
        dtypes = [tangent_dtype or o.dtype for o in differentiable]
        tangents = [
            _laid_out_like(o, draw(o.shape, d)) for o, d in zip(differentiable, dtypes, strict=True)
        ]
        torch.autograd.backward(differentiable, tangents)
    return [o.detach() for o in tensors]


def _tangent_draw(device: torch.device, seed: int) -> Callable[[Any, torch.dtype], torch.Tensor]:
    """Random tangents from a generator seeded with `seed`, on `device`; on the meta device
    (a step planned, not run: explorer.costmodel) empty ones, shapes being all there is."""
    if device.type == "meta":
        return lambda shape, dtype: torch.empty(shape, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    return lambda shape, dtype: torch.randn(shape, dtype=dtype, device=device, generator=gen)


def loss_of(result: Any, loss: Callable[[Any], torch.Tensor]) -> torch.Tensor:
    """`loss(result)`, refused unless it is a scalar tensor with a gradient."""
    try:
        value = loss(result)
    except Exception as exc:
        raise UserError(f"the loss raised {first_line(exc)}") from exc
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or not value.requires_grad:
        raise UserError(
            "the loss must return a one-element tensor that requires grad, computed from the "
            f"model's outputs; it returned {_described(value)}"
        )
    return value


def _described(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        grad = "" if value.requires_grad else ", without a gradient"
        return f"a tensor of shape {tuple(value.shape)}{grad}"
    return type(value).__name__


def _laid_out_like(output: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """`values` in the output's dtype and strides: the tangent the compiled backward expects.
    AOTAutograd copies a tangent laid out otherwise into those strides before its backward
    (a second tensor, which no plan counts): transformers' Gemma2 returns its sliding-window
    keys and values as slices, and contiguous tangents for them measured 3,832 bytes over
    the prediction. A contiguous output, or one whose elements overlap (an expanded tensor),
    keeps its values as they are."""
    if output.is_contiguous() or _overlapping(output):
        return values.to(output.dtype)
    laid_out = torch.empty_strided(
        output.shape, output.stride(), dtype=output.dtype, device=output.device
    )
    return laid_out.copy_(values)


def _overlapping(tensor: torch.Tensor) -> bool:
    """Whether two of the tensor's elements share memory (a stride 0, or strides that
    interleave)."""
    reach = 0  # the furthest element reached by the dimensions taken so far
    dims = zip(tensor.stride(), tensor.shape, strict=True)
    for stride, size in sorted((st, sz) for st, sz in dims if sz > 1):
        if stride <= reach:
            return True
        reach += (size - 1) * stride
    return False


def compare(
    name: str,
    pairs: list[tuple[torch.Tensor | None, torch.Tensor | None]],
    exact: list[torch.Tensor | None] | None = None,
    precision: torch.dtype | None = None,
) -> VerifyRow:
    """Equal tensors, pair by pair (reference, candidate); None on one side only is a failure.

    A pair that is neither bitwise equal nor close passes if `exact` (the same tensors from a
    float64 run, in pair order) shows the candidate no less accurate than the reference (see
    `as_accurate`). `precision`: the step's autocast dtype; the compiled step may round where
    eager PyTorch does not (a dropout's scaling), so a tensor then passes within that dtype's
    precision times the largest magnitude in the row (a gradient that is exactly zero in
    theory, a bias before a BatchNorm, is rounding noise of the others' size)."""
    atol_scale = ATOL_SCALE if precision is None else torch.finfo(precision).eps
    row_scale = 0.0 if precision is None else _largest(ref for ref, _ in pairs)
    bitwise, worst, failures, by_float64 = True, 0.0, [], 0
    for k, (ref, got) in enumerate(pairs):
        if ref is None and got is None:
            continue
        if ref is None or got is None:
            failures.append(f"#{k} missing in the {'reference' if ref is None else 'schedule'}")
            continue
        if ref.shape != got.shape or ref.dtype != got.dtype:
            failures.append(f"#{k} is {tuple(got.shape)} {got.dtype}, not {tuple(ref.shape)}")
            continue
        if torch.equal(ref, got):
            continue
        bitwise = False
        if not ref.is_floating_point():
            failures.append(f"#{k} differs")
            continue
        diff = (ref.double() - got.double()).abs().max().item()
        worst = max(worst, diff)
        scale = max(ref.abs().max().item(), row_scale)
        if torch.allclose(got, ref, rtol=RTOL, atol=atol_scale * max(scale, 1e-12)):
            continue
        if exact is not None and k < len(exact) and as_accurate(ref, got, exact[k], atol_scale):
            by_float64 += 1
            continue
        failures.append(f"#{k} differs by {diff:.2e}")
    if failures:
        measured = "NOT equal"
    elif bitwise:
        measured = BITWISE
    else:
        measured = f"max |diff| {worst:.2e}"
    note = f"{len(pairs)} tensors"
    if not bitwise and not failures:
        note += f"; rtol {RTOL}, atol {atol_scale:.3g}*max"
        if by_float64:
            note += (
                f"; {by_float64} no further from float64 than {FLOAT64_MULTIPLIER:g}x the "
                "unmodified model's error"
            )
    if failures:
        note += "; " + "; ".join(failures[:3]) + ("; ..." if len(failures) > 3 else "")
    return VerifyRow(name, measured, "equal", not failures and bool(pairs), note)


def _largest(tensors: Iterable[torch.Tensor | None]) -> float:
    """The largest magnitude among the floating-point tensors (0.0 if none)."""
    found = [t.abs().max().item() for t in tensors if t is not None and t.is_floating_point()]
    return max((m for m in found if math.isfinite(m)), default=0.0)


def as_accurate(
    reference: torch.Tensor,
    candidate: torch.Tensor,
    exact: torch.Tensor | None,
    atol_scale: float = ATOL_SCALE,
) -> bool:
    """The candidate is no further from the float64 answer (root mean square error) than
    `FLOAT64_MULTIPLIER` times the reference is, plus `atol_scale * max|exact|`."""
    if exact is None or exact.shape != reference.shape or not exact.is_floating_point():
        return False
    exact = exact.double()

    def error(x: torch.Tensor) -> float:
        return (x.double() - exact).pow(2).mean().sqrt().item()

    slack = atol_scale * exact.abs().max().item()
    return error(candidate) <= FLOAT64_MULTIPLIER * error(reference) + slack


def verify(
    path: str | Path,
    device: str | None = None,
    *,
    model: nn.Module | None = None,
    example_inputs: tuple | torch.Tensor | None = None,
    example_kwargs: dict | None = None,
    autocast: torch.dtype | None = None,
    seed: int = STEP_SEED,
    loss: Callable[[Any], torch.Tensor] | None = None,
    cancel: CancelToken | None = None,
) -> VerifyReport:
    """Run the exported schedule and the unmodified model side by side (module docstring).

    Without `model`, the model and its inputs are rebuilt from the SPEC the file records.
    `loss`: the loss the schedule was planned with (`Planner(loss=...)`), which the file
    names but cannot hold. `cancel` stops it between steps (Cancelled); it runs copies of
    the model, so nothing of the caller's is left half-stepped."""
    path = Path(path)
    seconds = timing_seconds()  # a bad $REMAT_EXPLORER_TIMING_SECONDS: refused before any work
    made_for, schedule = read_module(path)
    loss = _loss_for(path, made_for, loss)
    reference, args, kwargs = _models(made_for, model, example_inputs, example_kwargs, device)
    autocast = autocast or recorded_autocast(made_for)
    candidate = copy_model(reference)
    exact_model = copy_model(reference)  # for the float64 run (autocast leaves float64 alone)
    plain_model = copy_model(reference)  # for the step with nothing recomputed
    try:
        wrapped = wrap_with_schedule(candidate, made_for, schedule)
    except RematError as exc:
        raise UserError(f"{path}: {exc}") from exc
    check_cancel(cancel)
    ref_args, ref_kwargs = _fresh_inputs(args, kwargs)
    new_args, new_kwargs = _fresh_inputs(args, kwargs)
    # the user's model, whose kept activations (RAFT's pyramid) have their grad_fn: the
    # copies hold them detached
    state = held_state(model if model is not None else reference)
    static = tensor_bytes([*state, *tensors_in((args, kwargs))])
    dev = tensors_in((args, kwargs))[0].device
    values = InputValues((args, kwargs))  # each step starts from them (a forward may write)
    held = bool(made_for.get("gradients_held"))
    steps = _Steps((args, kwargs), values, seed, autocast, loss, held, path, schedule)
    if held:  # planned for steps that add to the gradients of an earlier one: make them
        _first_steps([reference, wrapped], steps)  # the float64 model's first is float64 too
        static += tensor_bytes([p.grad for p in candidate.parameters() if p.grad is not None])

    versions = _versions(reference), _versions(candidate)
    with _deterministic(dev):
        with (
            step_autocast(dev, autocast),
            LiveBytesTracker(dev, held=_state(reference)) as ref_meter,
        ):
            ref_out = training_step(reference, ref_args, seed, ref_kwargs, loss=loss)
        ref_written = _written(values, (ref_args, ref_kwargs))
        ref_draws = generator_states(reference, (args, kwargs))
        with (
            step_autocast(dev, autocast),
            _explained(path, schedule),
            LiveBytesTracker(dev, held=_state(candidate)) as new_meter,
        ):
            new_out = training_step(wrapped, new_args, seed, new_kwargs, loss=loss)
        new_written = _written(values, (new_args, new_kwargs))
        new_draws = generator_states(reference, (args, kwargs))
    check_cancel(cancel)

    if model is None and any(p.how != EXACT for p in wrapped.plans):
        spec = made_for.get("model", {})
        raise UserError(
            f"{path}: this schedule was made for another graph than {spec.get('name')} "
            f"(batch {spec.get('batch_size')}, input size {spec.get('input_size')}) traces to; "
            "the file was edited or made elsewhere: export a schedule for this model"
        )
    ref_inputs = tensors_in((ref_args, ref_kwargs))
    new_inputs = tensors_in((new_args, new_kwargs))
    needs_grad = [k for k, x in enumerate(ref_inputs) if x.requires_grad]
    checks = {
        "outputs": _paired(ref_out, new_out),
        "parameter gradients": [
            (a.grad, b.grad) for a, b in _paired(reference.parameters(), candidate.parameters())
        ],
        "input gradients": [(ref_inputs[k].grad, new_inputs[k].grad) for k in needs_grad],
        "buffers (BatchNorm statistics)": _paired(reference.buffers(), candidate.buffers()),
    }
    if ref_written or new_written:  # a side that wrote nothing holds the inputs as they were
        unwritten = [t.detach().clone() for t in tensors_in((args, kwargs))]
        checks[WRITTEN] = _paired(ref_written or unwritten, new_written or unwritten)
    if versions != (_versions(reference), _versions(candidate)):
        checks[PARAMETERS_WRITTEN] = _paired(
            [p.detach() for p in reference.parameters()],
            [p.detach() for p in candidate.parameters()],
        )
    checks = {name: pairs for name, pairs in checks.items() if pairs or name == "outputs"}
    rows = {name: compare(name, pairs, precision=autocast) for name, pairs in checks.items()}
    recomputation = None
    if any(row.measured != BITWISE for row in rows.values()):
        try:
            plain = _step_without_recomputation(plain_model, made_for, steps, needs_grad)
            recomputation = _recomputation_row(checks, plain, dev, autocast)
            del plain
        except (RuntimeError, TypeError) as exc:  # out of memory, as the float64 step may be
            note = f"the step with nothing recomputed could not run ({first_line(exc)})"
            recomputation = VerifyRow(RECOMPUTATION, "not run", BITWISE, False, note)
        finally:
            values.restore()
    del plain_model  # and its step's tensors: a GPU's peaks are measured after
    if not all(r.ok for r in rows.values()):
        exact, failure = {}, ""
        try:
            with _deterministic(dev):
                if held:  # the exact gradients the compared step adds to: each side's first
                    # step differs from the exact one as its second does, so both are float64
                    _float64_step(exact_model, args, kwargs, seed, needs_grad, ref_out, loss)
                    values.restore()
                exact = _float64_step(exact_model, args, kwargs, seed, needs_grad, ref_out, loss)
        except (RuntimeError, TypeError) as exc:  # out of memory, or no float64 kernel
            failure = f"the float64 step could not run ({first_line(exc)})"
        finally:
            values.restore()
        rows = {
            name: compare(name, pairs, exact.get(name), autocast) for name, pairs in checks.items()
        }
        for row in rows.values():
            if failure and not row.ok:
                row.note += f"; {failure}"
    if not drew_alike(ref_draws, new_draws):
        for row in rows.values():
            if not row.ok:
                row.note += f"; {OTHER_DRAWS}"
    del exact_model

    checked = [*rows.values(), *([recomputation] if recomputation else [])]
    report = VerifyReport(str(path), [_plan_row(wrapped), *checked])
    ref_peak, new_peak = ref_meter.peak_bytes, new_meter.peak_bytes
    # the wrapped model's compiled graphs hold constants, counted by the plan as static
    new_static = static + wrapped.backend.constant_bytes()
    if dev.type == "cuda":  # the peak as the user's kernel settings give it
        with _explained(path, schedule):
            ref_peak, new_peak, allocated, reserved = _cuda_peaks(reference, wrapped, steps)
        report.measurements["CUDA allocated peak (bytes)"] = new_static + allocated
        report.measurements["CUDA reserved peak (bytes)"] = reserved
    report.rows.append(_peak_row(new_static + new_peak, schedule))
    report.measurements["peak memory, unmodified model (bytes)"] = static + ref_peak
    report.measurements.update(_timings(reference, wrapped, steps, seconds, cancel))
    return report


def _loss_for(path: Path, made_for: dict, loss: Callable | None) -> Callable | None:
    """The loss of the step the schedule was planned for: the one given, the named one the
    file records, or none (random tangents on every output)."""
    planned = made_for.get("loss")
    if planned and loss is None:
        if planned in NAMED:
            return NAMED[planned]
        raise UserError(
            f"{path}: this schedule was planned with a loss ({planned}), which the file cannot "
            "hold: verify it from Python, explorer.verify(path, model=..., "
            "example_inputs=..., loss=...)"
        )
    if loss is not None and not planned:
        raise UserError(
            f"{path}: this schedule was planned for a step from random gradients on every "
            "output, not for a loss: verify it without loss=, or plan with Planner(loss=...)"
        )
    return loss


@dataclass
class _Steps:
    """What every step verify runs shares: the inputs, whose values are put back after each
    step (a forward may write into them); the seed, autocast precision and loss; whether the
    plan holds gradients from an earlier step; and the file and its schedule, for the one
    line that explains a failure (`_explained`)."""

    inputs: tuple[tuple, dict]
    values: InputValues
    seed: int
    autocast: torch.dtype | None
    loss: Callable[[Any], torch.Tensor] | None
    held: bool
    path: Path
    schedule: dict

    @property
    def device(self) -> torch.device:
        return tensors_in(self.inputs)[0].device

    def run(self, model) -> tuple[Any, tuple, dict]:
        """One training step of `model` on fresh inputs, under the step's autocast: its
        outputs and the inputs it ran on (not yet put back)."""
        step_args, step_kwargs = _fresh_inputs(*self.inputs)
        with step_autocast(self.device, self.autocast):
            out = training_step(model, step_args, self.seed, step_kwargs, loss=self.loss)
        return out, step_args, step_kwargs

    @contextlib.contextmanager
    def prepared(self, model) -> Iterator[Callable[[], Any]]:
        """One more step of `model`, started as the plan starts (its gradients cleared,
        unless the plan holds them) on fresh inputs under the step's autocast: the step,
        for the caller to meter or time, whose inputs are put back after it."""
        step_args, step_kwargs = _fresh_inputs(*self.inputs)
        if not self.held:
            clear_grads(model, (step_args, step_kwargs))
        with step_autocast(self.device, self.autocast):
            yield lambda: training_step(model, step_args, self.seed, step_kwargs, loss=self.loss)
        self.values.restore()


def _first_steps(models: list, steps: _Steps) -> None:
    """One step of each model, whose gradients the compared step adds to."""
    with _deterministic(steps.device), _explained(steps.path, steps.schedule):
        for model in models:
            steps.run(model)
            steps.values.restore()


def _written(values: InputValues, inputs: tuple[tuple, dict]) -> list[torch.Tensor] | None:
    """The inputs as a step left them, if it wrote into one; the inputs are put back."""
    if not values.written():
        return None
    written = [t.detach().clone() for t in tensors_in(inputs)]
    values.restore()
    return written


@contextlib.contextmanager
def _deterministic(device: torch.device):
    """On CUDA, deterministic kernels for the steps compared (cuDNN's atomic weight
    gradients differ from run to run); the user's settings are put back after."""
    if device.type != "cuda":
        yield
        return
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*determinis")
            yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[2:]


def _float64_step(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    seed: int,
    needs_grad: list[int],
    outputs: list,
    loss: Callable[[Any], torch.Tensor] | None,
) -> dict[str, list]:
    """The same training step in float64, from the same state, seed and tangents: the exact
    answer the two float32 runs are measured against, by check name. Inputs nested in lists
    and dicts are widened too (torchvision's Faster R-CNN takes a list of images and a list
    of target dicts), and so is what the model makes without naming a dtype (the default
    dtype is float64 for the step)."""
    model = model.to(torch.float64)

    def widen(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            return x.detach().to(torch.float64).requires_grad_(x.requires_grad)
        return x

    args64, kwargs64 = tree_map(widen, tuple(args)), tree_map(widen, dict(kwargs))
    tangent_dtype = next((o.dtype for o in outputs if o.is_floating_point()), None)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = training_step(model, args64, seed, kwargs64, tangent_dtype=tangent_dtype, loss=loss)
    finally:
        torch.set_default_dtype(default)
    inputs = tensors_in((args64, kwargs64))
    return _step_tensors(model, out, inputs, needs_grad, [t.detach() for t in inputs])


def _step_tensors(
    model: nn.Module,
    outputs: list,
    inputs: list[torch.Tensor],
    needs_grad: list[int],
    written: list[torch.Tensor],
) -> dict[str, list]:
    """What a step left, by check name: its outputs, gradients, buffers, and the inputs and
    parameters as it left them."""
    return {
        "outputs": list(outputs),
        "parameter gradients": [p.grad for p in model.parameters()],
        "input gradients": [inputs[k].grad for k in needs_grad],
        "buffers (BatchNorm statistics)": list(model.buffers()),
        WRITTEN: written,
        PARAMETERS_WRITTEN: [p.detach() for p in model.parameters()],
    }


def _step_without_recomputation(
    model: nn.Module, made_for: dict, steps: _Steps, needs_grad: list[int]
) -> dict[str, list]:
    """The compared step of `model` (a copy of the unmodified model as the steps started)
    under the runtime with nothing recomputed: the schedule's graphs left out, so that each
    graph runs its no-recompute plan (explorer.backend), with its first steps where the
    gradients are held. By check name, as `_step_tensors`."""
    plain = wrap_with_schedule(model, made_for, {**steps.schedule, "graphs": []})
    with warnings.catch_warnings():
        # no plan was made for its graphs, which is the point: not the user's concern
        warnings.simplefilter("ignore", RematWarning)
        if steps.held:
            _first_steps([plain], steps)
        with _deterministic(steps.device), _explained(steps.path, steps.schedule):
            out, step_args, step_kwargs = steps.run(plain)
    step_inputs = tensors_in((step_args, step_kwargs))
    written = _written(steps.values, (step_args, step_kwargs))
    if written is None:  # it wrote nothing: the inputs as they were
        written = [t.detach().clone() for t in tensors_in(steps.inputs)]
    return _step_tensors(model, out, step_inputs, needs_grad, written)


def _recomputation_row(
    checks: dict[str, list],
    plain: dict[str, list],
    device: torch.device,
    precision: torch.dtype | None = None,
) -> VerifyRow:
    """The schedule's tensors of every check against the no-recompute step's: bitwise on the
    CPU, whose kernels are deterministic. CUDA's are not all, even with deterministic
    algorithms asked for (an operator without such a kernel only warns: an upsampling's
    backward adds with atomics), so there a tensor may also pass within `compare`'s
    tolerance (`precision`: the step's autocast dtype, as for the other rows), and the row
    says in which checks."""
    compared = {
        name: compare(name, _paired(plain[name], [got for _, got in pairs]), precision=precision)
        for name, pairs in checks.items()
    }
    strict = device.type != "cuda"
    failed = [name for name, row in compared.items() if not row.ok]
    close = [name for name, row in compared.items() if row.ok and row.measured != BITWISE]
    differing = failed + close if strict else failed
    if differing:
        changed = "recomputation changed " + ", ".join(differing)
        return VerifyRow(RECOMPUTATION, "differs", BITWISE, False, changed)
    if close:
        note = (
            f"within tolerance in {', '.join(close)}: CUDA kernels without a deterministic "
            "version may differ from run to run"
        )
        return VerifyRow(RECOMPUTATION, "close", BITWISE, True, note)
    note = "the same compiled graphs, nothing recomputed: recomputation changes no bit"
    return VerifyRow(RECOMPUTATION, BITWISE, BITWISE, True, note)


def _cuda_peaks(reference, wrapped, steps: _Steps) -> tuple[int, int, int, int]:
    """One more step of each model, gradients cleared first unless the plan holds them, under
    the user's kernel settings: the unmodified and the scheduled peaks as requested of the
    allocator, and the scheduled step's allocated and reserved peaks."""
    peaks = []
    for model in (reference, wrapped):
        with steps.prepared(model) as step, LiveBytesTracker(steps.device) as meter:
            step()
        peaks.append(meter)
    ref, new = peaks
    return ref.peak_bytes, new.peak_bytes, new.peak_allocated_bytes, new.peak_reserved_bytes


def _state(model: nn.Module) -> list[torch.Tensor]:
    """The parameters and buffers, counted in every peak beside what a step allocates."""
    return [*model.parameters(), *model.buffers()]


def _versions(model: nn.Module) -> list[tuple[int, int]]:
    """The parameters' version counters, which every write into them advances, and their
    storages' addresses, which `p.data = ...` changes (a new storage is made while the old
    one is still held)."""
    return [(p._version, p.untyped_storage().data_ptr()) for p in model.parameters()]


def _paired(first, second) -> list:
    """Pairs in order; a length mismatch becomes (x, None) / (None, y) pairs, which fail."""
    a, b = list(first), list(second)
    width = max(len(a), len(b))
    return [(a[k] if k < len(a) else None, b[k] if k < len(b) else None) for k in range(width)]


def _plan_row(wrapped) -> VerifyRow:
    plans = wrapped.plans
    exact = [p for p in plans if p.how == EXACT]
    hows = sorted({p.how for p in plans if p.how != EXACT})
    note = f"{len(exact)} of {len(plans)} graphs"
    if hows:
        note += f"; others: {', '.join(hows)}"
    ok = bool(plans) and len(exact) == len(plans)
    return VerifyRow("plan applied as exported", len(exact), len(plans), ok, note)


def _peak_row(measured: int, schedule: dict) -> VerifyRow:
    predicted = int(schedule.get("predicted_peak_bytes", 0))
    budget = schedule.get("budget_bytes")
    error = (measured - predicted) / predicted if predicted else 1.0
    within = (budget is None or measured <= budget) and abs(error) <= PEAK_TOLERANCE
    note = f"{error:+.2%} vs predicted (tolerance {PEAK_TOLERANCE:.0%})"
    if budget is not None:
        note += f"; budget {format_bytes(budget)}"
    return VerifyRow("peak memory (bytes)", measured, predicted, within, note)


def _timings(
    reference, wrapped, steps: _Steps, seconds: float, cancel: CancelToken | None = None
) -> dict[str, float]:
    """Median step times, interleaved so that drifts in machine load hit both alike, over
    as many rounds as fit in `seconds` (explorer.timingrounds), and the lowest and highest
    overhead of a round (the schedule's step over the unmodified one just before it): how
    far to trust the medians' overhead. On the CPU, also each step's page faults."""
    dev = steps.device
    ref_times: list[float] = []
    new_times: list[float] = []
    ref_faults: list[int | None] = []
    new_faults: list[int | None] = []
    while another_round(ref_times, new_times, LEAST_ROUNDS, seconds):
        sides = ((reference, ref_times, ref_faults), (wrapped, new_times, new_faults))
        for model, times, faults in sides:
            check_cancel(cancel)
            with steps.prepared(model) as step:
                taken, faulted = faults_of(lambda s=step: time_step(s, dev))
            times.append(taken)
            faults.append(faulted)
    ref_s, new_s = statistics.median(ref_times), statistics.median(new_times)
    rounds = sorted(new / ref - 1 for new, ref in zip(new_times, ref_times, strict=True))
    quartiles = statistics.quantiles(rounds, n=4, method="inclusive")
    ref_count, new_count = median_faults(ref_faults), median_faults(new_faults)
    counted = (
        {FAULTS_UNMODIFIED: ref_count, FAULTS_SCHEDULE: new_count}
        if dev.type == "cpu" and ref_count is not None and new_count is not None
        else {}
    )
    return {
        "step seconds, schedule": new_s,
        STEP_UNMODIFIED: ref_s,
        "overhead, measured": new_s / ref_s - 1,
        LOWEST_ROUND: rounds[0],
        HIGHEST_ROUND: rounds[-1],
        FIRST_QUARTILE: quartiles[0],
        THIRD_QUARTILE: quartiles[2],
        TIMED_ROUNDS: len(rounds),
        "overhead, predicted": Schedule.from_dict(steps.schedule).predicted_overhead,
        **counted,
    }


@contextlib.contextmanager
def _explained(path: Path, schedule: dict):
    """One line for what can go wrong while the schedule runs: a schedule that does not fit
    the graph it meets, or a CUDA out-of-memory although the predicted peak fits (the caching
    allocator's fragmentation, with its remedy)."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as exc:
        peak = format_bytes(int(schedule.get("predicted_peak_bytes", 0)))
        raise UserError(
            f"CUDA ran out of memory although the schedule needs {peak}: the caching "
            "allocator is fragmented; rerun with "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
        ) from exc
    except Exception as exc:
        cause = _remat_cause(exc)
        if cause is None:
            raise
        raise UserError(f"{path}: {cause}") from exc


def _remat_cause(exc: BaseException) -> RematError | None:
    """The RematError behind an exception (Dynamo wraps backend errors), if any."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, RematError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _models(made_for, model, example_inputs, example_kwargs, device):
    if model is not None:
        if example_inputs is None and not example_kwargs:
            raise UserError("verify(model=...) needs example_inputs (and/or example_kwargs) too")
        args = example_inputs if example_inputs is not None else ()
        args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
        return as_trained(copy_model(module_inside(model))), args, dict(example_kwargs or {})
    recorded_spec(
        made_for,
        "this schedule",
        "verify it from Python with explorer.verify(path, model=..., example_inputs=...)",
    )
    built = build_recorded(made_for, device)
    return built.model, built.example_inputs, dict(built.example_kwargs)


def recorded_spec(made_for: dict, made: str, instead: str) -> dict:
    """The model record of a MADE_FOR (explorer.planner.Planner.made_for), refused in one line
    where no SPEC builds that model again: `made` names what was made for it (a schedule, a
    front), `instead` says what to do."""
    spec = made_for.get("model", {})
    if not spec.get("buildable"):
        name = spec.get("name")
        raise UserError(f"{made} was made for a model without a SPEC ({name}): {instead}")
    return spec


def build_recorded(made_for: dict, device: str | None = None):
    """The model and example inputs a MADE_FOR records (its SPEC checked by recorded_spec),
    built again on `device` (None: the recorded one) from the recorded seed."""
    from explorer.models import build

    spec = made_for["model"]
    return build(
        spec["name"],
        spec.get("batch_size"),
        spec.get("input_size"),
        device or made_for.get("device", "cpu"),
        seed=made_for.get("seed", 0),
    )


def _fresh_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Copies of the inputs for one run: an input that requires grad gets its own leaf, so
    each run's input gradient can be read and compared."""

    def fresh(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            return x.detach().clone().requires_grad_(True)
        return x

    return tuple(fresh(a) for a in args), {k: fresh(v) for k, v in kwargs.items()}


# the autocast dtypes a MADE_FOR may name (Planner.made_for writes str(dtype))
AUTOCAST_DTYPES = {str(torch.bfloat16): torch.bfloat16, str(torch.float16): torch.float16}


def recorded_autocast(made_for: dict) -> torch.dtype | None:
    """The autocast dtype a MADE_FOR records (None: none, or one not known)."""
    return AUTOCAST_DTYPES.get(made_for.get("autocast") or "")


@contextlib.contextmanager
def step_autocast(device: torch.device, dtype: torch.dtype | None):
    """`torch.autocast` on `device` with `dtype`, or nothing when `dtype` is None."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield
