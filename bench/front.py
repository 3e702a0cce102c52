"""Benchmark: a model's Pareto front, predicted and measured, beside PyTorch's own tools.

    python bench/front.py --model resnet50 --batch-size 8 --input-size 128 [--measure 3]

Prints the front (budget, predicted peak, predicted overhead, solve seconds, gap, status),
the whole sweep time, then measures `--measure` points spread over the front and PyTorch's
tools (no recomputation, `checkpoint` on every block, `checkpoint_sequential` with sqrt(n)
segments) on the same model: interleaved runs, the same memory meter (on CPU the live-tensor
tracker, one thread; with --device cuda, torch.cuda.max_memory_allocated). Writes
bench/results/front_<model>_b<batch>_s<size>.json.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

import explorer
from explorer import peers
from explorer.backend import wrap_with_schedule
from explorer.memory import LiveBytesTracker, tensor_bytes, time_step
from explorer.models import build
from explorer.units import format_bytes
from explorer.verify import training_step

RESULTS = Path(__file__).parent / "results"


def sweep(spec: str, batch: int, size: int | None, points: int, device: str):
    built = build(spec, batch, size, device=device)
    plan = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    started = time.perf_counter()
    plan.profile()
    profiled = time.perf_counter() - started
    front = plan.sweep(points=points)
    total = time.perf_counter() - started
    return built, plan, front, profiled, total


def _ratio(reference, wrapped, inputs, seed: int) -> float:
    """Step time of ours over the unmodified model's, run back to back."""
    device = inputs[0].device
    base = time_step(lambda: training_step(reference, inputs, seed), device)
    ours = time_step(lambda: training_step(wrapped, inputs, seed), device)
    return ours / base


def measure_points(built, front, count: int, repeats: int) -> list[dict]:
    """Measured peak and step time of `count` front points against the unmodified model."""
    picks = sorted({round(k * (len(front.points) - 1) / max(count - 1, 1)) for k in range(count)})
    static = tensor_bytes(
        [*built.model.parameters(), *built.model.buffers(), *built.example_inputs]
    )
    rows = []
    for k in picks:
        point = front.points[k]
        reference = copy.deepcopy(built.model)
        wrapped = wrap_with_schedule(
            copy.deepcopy(built.model), front.model, point.schedule.to_dict()
        )
        training_step(wrapped, built.example_inputs, 0)  # capture and compile first
        with LiveBytesTracker(built.example_inputs[0].device) as meter:
            training_step(wrapped, built.example_inputs, 0)
        # A B A B: machine drift hits both alike
        ratios = [_ratio(reference, wrapped, built.example_inputs, r) for r in range(repeats)]
        rows.append(
            {
                "point": k,
                "budget_bytes": point.budget_bytes,
                "predicted_peak_bytes": point.predicted_peak_bytes,
                "measured_peak_bytes": static + meter.peak_bytes,
                "predicted_overhead": point.predicted_overhead,
                "measured_overhead": statistics.median(ratios) - 1,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--input-size", type=int, default=128)
    parser.add_argument("--points", type=int, default=12)
    parser.add_argument("--measure", type=int, default=3, help="front points to measure")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)

    built, plan, front, profiled, total = sweep(
        args.model, args.batch_size, args.input_size, args.points, args.device
    )
    fixed = front.fixed_bytes
    activations = front.baseline_peak_bytes - fixed
    print(
        f"{args.model} batch {args.batch_size} input {args.input_size}, "
        f"{front.setup.get('device')}, torch {torch.__version__}"
    )
    print(
        f"no recomputation: peak {format_bytes(front.baseline_peak_bytes)} "
        f"(parameters, buffers, inputs and gradients {format_bytes(fixed)}, "
        f"activations {format_bytes(activations)})"
    )
    print(f"setup: {front.setup}")
    print(
        f"{'budget':>11} {'peak':>11} {'activations':>12} {'overhead':>9} {'solve s':>8} "
        f"{'gap':>6} status"
    )
    for p in front.points:
        share = (p.predicted_peak_bytes - fixed) / max(activations, 1)
        print(
            f"{format_bytes(p.budget_bytes):>11} {format_bytes(p.predicted_peak_bytes):>11} "
            f"{share:>11.0%} {p.predicted_overhead:>+9.1%} {p.solve_seconds:>8.3f} "
            f"{p.gap:>6.2%} {p.status}"
        )
    print(f"profile {profiled:.1f} s; profile + sweep {total:.1f} s")

    measured = measure_points(built, front, args.measure, args.repeats)
    peer_points = peers.measure(built.model, built.example_inputs, repeats=args.repeats)
    eager = next(p for p in peer_points if p.name == "eager")
    print(
        f"\nmeasured (live-tensor bytes, median step-time ratio of {args.repeats} interleaved runs)"
    )
    print(f"{'variant':<34} {'peak':>11} {'activations':>12} {'overhead':>9}")
    for p in peer_points:
        if not p.measured:
            print(f"{p.name:<34} skipped: {p.detail}")
            continue
        share = (p.peak_bytes - fixed) / max(eager.peak_bytes - fixed, 1)
        print(f"{p.name:<34} {format_bytes(p.peak_bytes):>11} {share:>11.0%} {p.overhead:>+9.1%}")
    for row in measured:
        share = (row["measured_peak_bytes"] - fixed) / max(eager.peak_bytes - fixed, 1)
        name = f"remat-explorer point {row['point']}"
        print(
            f"{name:<34} {format_bytes(row['measured_peak_bytes']):>11} {share:>11.0%} "
            f"{row['measured_overhead']:>+9.1%}  (predicted "
            f"{format_bytes(row['predicted_peak_bytes'])}, {row['predicted_overhead']:+.1%})"
        )

    RESULTS.mkdir(exist_ok=True)
    out = (
        RESULTS / f"front_{args.model.replace(':', '_')}_b{args.batch_size}_s{args.input_size}.json"
    )
    out.write_text(
        json.dumps(
            {
                "model": args.model,
                "batch_size": args.batch_size,
                "input_size": args.input_size,
                "torch": torch.__version__,
                "device": front.setup.get("device"),
                "fixed_bytes": fixed,
                "baseline_peak_bytes": front.baseline_peak_bytes,
                "sweep_seconds": total,
                "profile_seconds": profiled,
                "setup": front.setup,
                "front": [
                    {k: v for k, v in p.to_dict().items() if k != "schedule"} for p in front.points
                ],
                "measured": measured,
                "peers": [p.__dict__ for p in peer_points],
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
