"""Benchmark: a model's Pareto front beside PyTorch's own tools, on one meter.

    python bench/front.py --model resnet50 --batch-size 8 --input-size 128 [--measure 3]
        [--points 12] [--repeats 5] [--budgets 1.0 0.5 0.2] [--compile-backend auto]
        [--device cpu] [--results bench/results]

Sweeps the front and prints it (budget, predicted peak, predicted overhead, solve seconds,
gap, status). Then runs, in this one process and on the same training step
(`explorer.verify.training_step`, gradients cleared before every step):

- eager: the model as it is, no recomputation;
- checkpoint per block, and checkpoint_sequential with about sqrt(n) segments: the model
  seen as a chain of blocks by `explorer.peers.sequentialize`, or else the blocks of its
  largest ModuleList (a transformer's layers); skipped if it has neither;
- torch.compile with `torch._functorch.config.activation_memory_budget` at each of
  `--budgets`: PyTorch's own min-cut partitioner, told how much of the activations to keep;
- `--measure` points of our front, always including the lowest point, the point nearest half
  the activation memory and the no-recomputation point, the rest spread between them.

Every variant is warmed up (captured and compiled) first, then, after one untimed round,
timed in `--repeats` rounds that run every variant once each (the order rotating from round
to round), so that a noisy machine slows all of them alike; a variant's time is the median
over rounds of its step time over eager's in the same round, printed beside the median of
its steps' minor page faults (explorer.pagefaults). Then one untimed step each
under `LiveBytesTracker` (on CPU the live-tensor meter, one thread; with --device cuda,
the bytes requested of the caching allocator), plus the parameters, buffers and inputs: a
whole-step peak, the quantity the planner predicts.

torch.compile's backend (`--compile-backend auto`): inductor on CUDA; aot_eager on CPU,
because inductor's CPU code allocates its buffers outside the dispatcher, where the live-tensor
meter cannot see them (a step reads 0 bytes). aot_eager runs AOTAutograd and the same min-cut
partitioner with the memory budget, then the partitioned graphs op by op, unfused, as eager
and our schedules run. Each budget is compiled on a code object of its own (so no budget can
reuse another's graphs) with the budget patched in around the compile and the first call.

Writes <results>/front_<model>_b<batch>_s<size>.json; `bench/chart.py` draws it.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import explorer
from explorer import peers
from explorer.backend import compile_call, wrap_with_schedule
from explorer.memory import LiveBytesTracker, tensor_bytes, time_step
from explorer.models import Built, build
from explorer.modelstate import grad_holders, kept, tensors_in
from explorer.pagefaults import faults_of, median_faults
from explorer.sweep import Front
from explorer.units import format_bytes
from explorer.verify import training_step

RESULTS = Path(__file__).parent / "results"
DEFAULT_BUDGETS = (1.0, 0.5, 0.2)
COMPILE_BACKENDS = ("auto", "aot_eager", "aot_eager_decomp_partition", "inductor")
STEP = (
    "explorer.verify.training_step: forward with seed r, backward from seeded random tangents "
    "on every output; parameter gradients cleared before each step"
)


@dataclass
class Variant:
    """One way to run the training step: called like the model; `model` holds the gradients."""

    name: str
    family: str  # "eager", "checkpoint", "torch.compile" or "remat-explorer"
    model: nn.Module
    forward: Callable[..., Any]
    detail: str
    extra: dict = field(default_factory=dict)


@dataclass
class Skipped:
    """A variant that could not run, and why."""

    name: str
    family: str
    detail: str


def sweep(
    spec: str, batch: int, size: int | None, points: int, device: str
) -> tuple[Built, Front, float, float]:
    """Build the model, profile it and sweep `points` budgets; the seconds each took."""
    built = build(spec, batch, size, device=device)
    plan = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    started = time.perf_counter()
    plan.profile()
    profiled = time.perf_counter() - started
    front = plan.sweep(points=points)
    total = time.perf_counter() - started
    return built, front, profiled, total


# ---------------------------------------------------------------- which front points


def pick_points(front: Front, count: int) -> list[int]:
    """Indices of `count` front points: the lowest, the no-recomputation point, the one
    nearest half the activation memory (in that priority), then each next one as far in
    predicted peak from those already chosen as can be."""
    points = front.points
    if count <= 0 or not points:
        return []
    activations = max(front.baseline_peak_bytes - front.fixed_bytes, 1)
    share = [(p.predicted_peak_bytes - front.fixed_bytes) / activations for p in points]
    no_recompute = [k for k, p in enumerate(points) if not p.recomputed]
    top = no_recompute[0] if no_recompute else len(points) - 1
    half = min(range(len(points)), key=lambda k: abs(share[k] - 0.5))
    chosen = list(dict.fromkeys([0, top, half]))[:count]
    while len(chosen) < min(count, len(points)):
        rest = [k for k in range(len(points)) if k not in chosen]
        chosen.append(max(rest, key=lambda k: min(abs(share[k] - share[c]) for c in chosen)))
    return sorted(chosen)


# ---------------------------------------------------------------- the variants


def eager_variant(model: nn.Module) -> Variant:
    """The model as it is."""
    reference = copy.deepcopy(model)
    return Variant("eager", "eager", reference, reference, "no recomputation: the model as it is")


CHECKPOINT_NAMES = ("checkpoint per block", "checkpoint_sequential")


def checkpoint_variants(model: nn.Module, inputs: tuple) -> tuple[list[Variant], list[Skipped]]:
    """checkpoint on every block and checkpoint_sequential (about sqrt(n) segments, the last
    not checkpointed). The blocks: the model as a chain (`explorer.peers.sequentialize`), as
    `explorer.peers` runs them; else the blocks of its largest ModuleList (a transformer's
    layers), which the model's forward calls one by one (`block_list_variants`)."""
    own = copy.deepcopy(model)
    chain = peers.sequentialize(own, inputs)
    if chain is None:
        return block_list_variants(model, inputs)
    n = len(chain)
    segments = max(1, round(math.sqrt(n)))
    note = _batchnorm_note(own)

    def per_block(x: torch.Tensor) -> torch.Tensor:
        for block in chain:
            x = checkpoint(block, x, use_reentrant=False)
        return x

    def sequential(x: torch.Tensor) -> torch.Tensor:
        return checkpoint_sequential(chain, segments, x, use_reentrant=False)

    return [
        Variant(
            CHECKPOINT_NAMES[0],
            "checkpoint",
            own,
            per_block,
            f"torch.utils.checkpoint (non-reentrant) on each of {n} blocks{note}",
        ),
        Variant(
            CHECKPOINT_NAMES[1],
            "checkpoint",
            own,
            sequential,
            f"{segments} segments of {n} blocks, the last not checkpointed{note}",
            {"segments": segments, "blocks": n},
        ),
    ], []


def block_list_variants(model: nn.Module, inputs: tuple) -> tuple[list[Variant], list[Skipped]]:
    """The two checkpoint variants on the blocks of the model's largest ModuleList.

    Each variant gets its own copy of the model whose blocks' ``forward`` is replaced: per
    block, each block runs under `checkpoint`; sequential, the first block of each segment runs
    its whole segment under one `checkpoint` (checkpoint_sequential's segments: n // sqrt(n)
    blocks each, the rest after the last one not checkpointed) and the segment's other blocks
    pass their input through. Used only where the output equals the model's (same seed)."""
    found = _largest_block_list(model)
    if found is None:
        return [], [Skipped(name, "checkpoint", peers.NOT_A_CHAIN) for name in CHECKPOINT_NAMES]
    path, n = found
    count = max(1, round(math.sqrt(n)))
    size = n // count
    plans = {
        CHECKPOINT_NAMES[0]: ([[k] for k in range(n)], f"each of the {n} blocks"),
        CHECKPOINT_NAMES[1]: (
            [list(range(s, s + size)) for s in range(0, size * (count - 1), size)],
            f"{count} segments of the {n} blocks (the last, blocks {size * (count - 1)} to "
            f"{n - 1}, not checkpointed)",
        ),
    }
    expected = _seeded_first_output(model, inputs)
    variants, skipped = [], []
    for name, (segments, what) in plans.items():
        own = copy.deepcopy(model)
        _checkpoint_segments(own.get_submodule(path), segments)
        if not _same(_seeded_first_output(own, inputs), expected):
            skipped.append(Skipped(name, "checkpoint", f"{peers.NOT_A_CHAIN} ({path})"))
            continue
        detail = (
            f"torch.utils.checkpoint (non-reentrant) on {what} in {path} (a ModuleList that "
            f"the forward calls block by block){_batchnorm_note(own)}"
        )
        variants.append(Variant(name, "checkpoint", own, own, detail, {"blocks": n}))
    return variants, skipped


def _largest_block_list(model: nn.Module) -> tuple[str, int] | None:
    """Path and length of the ModuleList (of two or more) holding the most parameters."""
    lists = [
        (sum(p.numel() for p in m.parameters()), name, len(m))
        for name, m in model.named_modules()
        if isinstance(m, nn.ModuleList) and len(m) > 1
    ]
    if not lists:
        return None
    _, name, n = max(lists)
    return name, n


def _checkpoint_segments(blocks: nn.ModuleList, segments: list[list[int]]) -> None:
    """Make the first block of each segment run the whole segment under one checkpoint and
    the segment's other blocks return their input (see `block_list_variants`)."""
    for segment in segments:
        members = [blocks[k] for k in segment]

        def run(x: torch.Tensor, members: list[nn.Module] = members) -> torch.Tensor:
            for block in members:
                x = type(block).forward(block, x)
            return x

        members[0].forward = lambda x, run=run: checkpoint(run, x, use_reentrant=False)
        for block in members[1:]:
            block.forward = _passthrough


def _passthrough(x: torch.Tensor) -> torch.Tensor:
    return x


def _seeded_first_output(model: nn.Module, inputs: tuple) -> torch.Tensor | None:
    """The first output tensor of a forward from seed 0 (no gradients), or None on failure."""
    try:
        with kept(model, inputs), torch.no_grad():  # BatchNorm statistics and RNG put back
            torch.manual_seed(0)
            outputs = model(*inputs)
    except Exception:  # any failure (signatures, types) means the rewrite does not fit
        return None
    return next((x for x in tree_leaves(outputs) if isinstance(x, torch.Tensor)), None)


def _same(got: torch.Tensor | None, expected: torch.Tensor | None) -> bool:
    return (
        got is not None
        and expected is not None
        and got.shape == expected.shape
        and torch.allclose(got, expected, rtol=1e-4, atol=1e-6)
    )


def _batchnorm_note(model: nn.Module) -> str:
    batchnorm = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
    return "; BatchNorm statistics updated twice per step" if batchnorm else ""


def compile_backend(choice: str, device: torch.device) -> tuple[str, str]:
    """The torch.compile backend for `choice` on `device`, and why."""
    if choice != "auto":
        return choice, "chosen with --compile-backend"
    if device.type == "cuda":
        return "inductor", "inductor on CUDA: fused kernels; the CUDA meter sees every byte"
    return "aot_eager", (
        "aot_eager on CPU: inductor's CPU buffers are allocated outside the dispatcher, where "
        "the live-tensor meter cannot see them; aot_eager runs the same partitioner's graphs "
        "op by op, unfused, as eager and our schedules run"
    )


def compile_variant(model: nn.Module, budget: float, backend_name: str) -> Variant:
    """torch.compile with `activation_memory_budget=budget`, on a code object of its own.

    The budget is patched in around every call of the backend (the compile: AOTAutograd's
    partitioner reads it there); `warm_up` patches it around the first step as well."""
    own = copy.deepcopy(model)
    inner = torch._dynamo.lookup_backend(backend_name)
    graphs: list[int] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(len(gm.graph.nodes))
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return inner(gm, example_inputs)

    compiled = compile_call(backend)

    def forward(*args: Any, **kwargs: Any) -> Any:
        return compiled(own, *args, **kwargs)

    return Variant(
        f"torch.compile budget {budget:g}",
        "torch.compile",
        own,
        forward,
        f"torch.compile(backend={backend_name!r}), activation_memory_budget={budget:g}",
        {"activation_memory_budget": budget, "backend": backend_name, "graphs": graphs},
    )


def front_variant(model: nn.Module, front: Front, k: int) -> Variant:
    """Our front's point `k`, run by our torch.compile backend."""
    point = front.points[k]
    wrapped = wrap_with_schedule(copy.deepcopy(model), front.model, point.schedule.to_dict())
    return Variant(
        f"remat-explorer point {k}",
        "remat-explorer",
        wrapped.model,
        wrapped,
        f"front point {k} of {len(front.points)}",
        {
            "point": k,
            "budget_bytes": point.budget_bytes,
            "predicted_peak_bytes": point.predicted_peak_bytes,
            "predicted_overhead": point.predicted_overhead,
        },
    )


# ---------------------------------------------------------------- measuring


def clear_grads(variant: Variant, inputs: tuple, kwargs: dict) -> None:
    """Drop the gradients of the variant's parameters (and leaf inputs)."""
    for tensor in grad_holders(variant.model, (inputs, kwargs)):
        tensor.grad = None


def run_step(variant: Variant, inputs: tuple, kwargs: dict, seed: int = 0) -> None:
    """One training step from no gradients; they are dropped again after it, so that the
    variants waiting their turn do not hold a copy of the gradients each."""
    clear_grads(variant, inputs, kwargs)
    training_step(variant.forward, inputs, seed, kwargs)
    clear_grads(variant, inputs, kwargs)


def warm_up(
    variants: list[Variant], inputs: tuple, kwargs: dict
) -> tuple[list[Variant], list[Skipped]]:
    """One step each (capture and compile); a checkpoint variant that fails is skipped."""
    working, failed = [], []
    for variant in variants:
        started = time.perf_counter()
        budget = variant.extra.get("activation_memory_budget")
        patched = (
            contextlib.nullcontext()
            if budget is None
            else torch._functorch.config.patch(activation_memory_budget=budget)
        )
        try:
            with patched:
                run_step(variant, inputs, kwargs)
        except RuntimeError as error:
            if variant.family != "checkpoint":
                raise
            reason = f"failed: {str(error).splitlines()[0]}"
            failed.append(Skipped(variant.name, variant.family, reason))
            continue
        working.append(variant)
        print(f"  warm-up {variant.name}: {time.perf_counter() - started:.1f} s", flush=True)
    return working, failed


def time_rounds(
    variants: list[Variant], inputs: tuple, kwargs: dict, repeats: int, device: torch.device
) -> tuple[dict[str, list[float]], dict[str, list[int | None]]]:
    """Step seconds and minor page faults of every variant in `repeats` rounds, after one
    untimed round; each round runs each variant once, starting one further along each round.
    The faults are what glibc's handing back of freed memory costs (explorer.pagefaults)."""
    times: dict[str, list[float]] = {v.name: [] for v in variants}
    faults: dict[str, list[int | None]] = {v.name: [] for v in variants}
    for variant in variants:  # one untimed round: the first steps after a compile run slow
        run_step(variant, inputs, kwargs)
    for r in range(repeats):
        shift = r % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            seconds, faulted = faults_of(
                lambda v=variant, r=r: time_step(lambda: run_step(v, inputs, kwargs, r), device)
            )
            faults[variant.name].append(faulted)
            times[variant.name].append(seconds)
        print(f"  timed round {r + 1}/{repeats}", flush=True)
    return times, faults


def peak(variant: Variant, inputs: tuple, kwargs: dict, device: torch.device) -> int:
    """Bytes allocated at most during one step (gradients included), untimed."""
    clear_grads(variant, inputs, kwargs)  # before entry: on CUDA the baseline must not hold them
    with LiveBytesTracker(device) as meter:
        training_step(variant.forward, inputs, 0, kwargs)
    clear_grads(variant, inputs, kwargs)
    return meter.peak_bytes


def measure(
    variants: list[Variant], built: Built, repeats: int
) -> tuple[list[dict], list[Skipped]]:
    """Warm up, time in rounds, then meter each variant (module docstring); rows for JSON."""
    inputs, kwargs = built.example_inputs, dict(built.example_kwargs)
    device = tensors_in((inputs, kwargs))[0].device
    static = tensor_bytes(
        [*built.model.parameters(), *built.model.buffers(), *tensors_in((inputs, kwargs))]
    )
    variants, failed = warm_up(variants, inputs, kwargs)
    times, faults = time_rounds(variants, inputs, kwargs, repeats, device)
    eager = times["eager"]
    rows = []
    for variant in variants:
        ratios = [t / e for t, e in zip(times[variant.name], eager, strict=True)]
        peak_bytes = static + peak(variant, inputs, kwargs, device)
        extra = dict(variant.extra)
        if "graphs" in extra:
            extra["graphs"] = len(extra["graphs"])  # compiles by this budget's backend, in all
        rows.append(
            {
                "name": variant.name,
                "family": variant.family,
                "peak_bytes": peak_bytes,
                "step_seconds": statistics.median(times[variant.name]),
                "step_seconds_all": times[variant.name],
                "time_ratio": statistics.median(ratios),
                "overhead": statistics.median(ratios) - 1,
                "page_faults_per_step": median_faults(faults[variant.name]),  # None: not counted
                "detail": variant.detail,
                **extra,
            }
        )
    return rows, failed


# ---------------------------------------------------------------- output


def print_front(front: Front) -> None:
    """The swept front, one line a point."""
    fixed = front.fixed_bytes
    activations = front.baseline_peak_bytes - fixed
    print(
        f"no recomputation (predicted): peak {format_bytes(front.baseline_peak_bytes)} "
        f"(parameters, buffers, inputs and gradients {format_bytes(fixed)}, "
        f"activations {format_bytes(activations)})"
    )
    print(f"setup: {front.setup}")
    print(
        f"{'':>3} {'budget':>11} {'peak':>11} {'activations':>12} {'overhead':>9} "
        f"{'solve s':>8} {'gap':>6} status"
    )
    for k, p in enumerate(front.points):
        share = (p.predicted_peak_bytes - fixed) / max(activations, 1)
        print(
            f"{k:>3} {format_bytes(p.budget_bytes):>11} "
            f"{format_bytes(p.predicted_peak_bytes):>11} {share:>11.0%} "
            f"{p.predicted_overhead:>+9.1%} {p.solve_seconds:>8.3f} {p.gap:>6.2%} {p.status}"
        )


def print_measured(rows: list[dict], skipped: list[Skipped], fixed: int, repeats: int) -> None:
    """The measured variants: peak, share of eager's activations, median time ratio."""
    eager = next(r for r in rows if r["name"] == "eager")
    print(f"\nmeasured (one meter; median step-time ratio over {repeats} interleaved rounds)")
    print(f"{'variant':<30} {'peak':>11} {'activations':>12} {'overhead':>9} {'faults':>8}")
    for row in rows:
        share = (row["peak_bytes"] - fixed) / max(eager["peak_bytes"] - fixed, 1)
        line = (
            f"{row['name']:<30} {format_bytes(row['peak_bytes']):>11} {share:>11.0%} "
            f"{row['overhead']:>+9.1%} {_count(row['page_faults_per_step']):>8}"
        )
        if "predicted_peak_bytes" in row:
            line += (
                f"  (predicted {format_bytes(row['predicted_peak_bytes'])}, "
                f"{row['predicted_overhead']:+.1%})"
            )
        print(line)
    for s in skipped:
        print(f"{s.name:<30} skipped: {s.detail}")


def _count(faults: int | None) -> str:
    """A step's page faults for the table: "-" where the system does not count them."""
    return "-" if faults is None else f"{faults:,}"


def main() -> None:
    """Parse the command line, sweep, measure, print and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-size", type=int, default=128)
    parser.add_argument("--points", type=int, default=12, help="budgets to sweep")
    parser.add_argument("--measure", type=int, default=3, help="front points to measure")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument(
        "--budgets",
        type=float,
        nargs="*",
        default=list(DEFAULT_BUDGETS),
        help="torch.compile activation_memory_budget values (none: skip torch.compile)",
    )
    parser.add_argument("--compile-backend", choices=COMPILE_BACKENDS, default="auto")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder for the JSON")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.compile_backend == "inductor" and not args.device.startswith("cuda"):
        parser.error(
            "on CPU the live-tensor meter cannot see inductor's buffers (allocated outside "
            "the dispatcher: a step reads 0 bytes); use aot_eager, or --device cuda"
        )
    torch.set_num_threads(1)
    started = time.perf_counter()

    built, front, profiled, total = sweep(
        args.model, args.batch_size, args.input_size, args.points, args.device
    )
    print(
        f"{args.model} batch {args.batch_size} input {args.input_size}, "
        f"{front.setup.get('device')}, torch {torch.__version__}"
    )
    print_front(front)
    print(f"profile {profiled:.1f} s; profile + sweep {total:.1f} s", flush=True)

    device = tensors_in(built.example_inputs)[0].device
    backend, why = compile_backend(args.compile_backend, device)
    inputs = built.example_inputs
    variants = [eager_variant(built.model)]
    checkpoints, skipped = checkpoint_variants(built.model, inputs)
    variants += checkpoints
    variants += [compile_variant(built.model, b, backend) for b in args.budgets]
    picks = pick_points(front, args.measure)
    variants += [front_variant(built.model, front, k) for k in picks]
    print(f"\nmeasuring {len(variants)} variants; torch.compile backend: {why}", flush=True)
    rows, failed = measure(variants, built, args.repeats)
    skipped += failed
    print_measured(rows, skipped, front.fixed_bytes, args.repeats)

    args.results.mkdir(parents=True, exist_ok=True)
    name = args.model.replace(":", "_")
    out = args.results / f"front_{name}_b{args.batch_size}_s{args.input_size}.json"
    eager = next(r for r in rows if r["name"] == "eager")
    out.write_text(
        json.dumps(
            {
                "model": args.model,
                "batch_size": args.batch_size,
                "input_size": args.input_size,
                "torch": torch.__version__,
                "device": front.setup.get("device"),
                "threads": torch.get_num_threads(),
                # glibc's settings, which move CPU step times (docs/BENCHMARKS.md)
                "malloc_environment": {
                    k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")
                },
                "meter": (
                    "CUDA caching allocator, bytes requested (requested_bytes.all.peak)"
                    if device.type == "cuda"
                    else "explorer.memory.LiveBytesTracker (live tensor bytes)"
                )
                + " during one step, plus parameters, buffers and inputs",
                "step": STEP,
                "repeats": args.repeats,
                "fixed_bytes": front.fixed_bytes,
                "baseline_peak_bytes": front.baseline_peak_bytes,
                "eager_peak_bytes": eager["peak_bytes"],
                "eager_step_seconds": eager["step_seconds"],
                "compile_backend": backend,
                "compile_backend_why": why,
                "sweep_seconds": total,
                "profile_seconds": profiled,
                "bench_seconds": time.perf_counter() - started,
                "setup": front.setup,
                "front": [
                    {k: v for k, v in p.to_dict().items() if k != "schedule"} for p in front.points
                ],
                "measured": [r for r in rows if r["family"] == "remat-explorer"],
                "peers": [r for r in rows if r["family"] != "remat-explorer"],
                "skipped": [s.__dict__ for s in skipped],
            },
            indent=1,
        )
    )
    print(f"wrote {out} ({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
