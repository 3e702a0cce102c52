"""Benchmark: what running under the runtime costs, against the unmodified model.

    python bench/runtime.py [--models resnet50:8:128 sample:gpt:8:256] [--repeats 7]

For each model: the no-recomputation schedule's step time over eager (the runtime's own cost:
Dynamo's guards, AOTAutograd's wrappers, the generated FX code; goal <= 1.02x), the first
step (capture and compile), the first step at a new shape (a smaller batch: captured again,
the schedule mapped onto the new graph), and a later step at that shape. Steps are timed
interleaved (eager, schedule, eager, schedule, ...) on one thread; the table shows medians.
Writes bench/results/runtime.json.
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
from explorer.backend import wrap_with_schedule
from explorer.models import build
from explorer.verify import training_step

RESULTS = Path(__file__).parent / "results"


def _seconds(step) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def measure(spec: str, batch: int, size: int, repeats: int) -> dict:
    built = build(spec, batch, size)
    plan = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    baseline = plan.baseline()
    reference = copy.deepcopy(built.model)
    wrapped = wrap_with_schedule(copy.deepcopy(built.model), plan.made_for(), baseline.to_dict())
    inputs = built.example_inputs
    smaller = tuple(x[: max(1, x.shape[0] // 2)] for x in inputs)

    training_step(reference, inputs, 0)  # warm eager too
    first = _seconds(lambda: training_step(wrapped, inputs, 0))
    eager, ours = [], []
    for r in range(repeats):
        eager.append(_seconds(lambda r=r: training_step(reference, inputs, r)))
        ours.append(_seconds(lambda r=r: training_step(wrapped, inputs, r)))
    new_shape = _seconds(lambda: training_step(wrapped, smaller, 0))
    again = statistics.median(
        _seconds(lambda: training_step(wrapped, smaller, 0)) for _ in range(3)
    )
    ratios = [b / a for a, b in zip(eager, ours, strict=True)]
    return {
        "model": spec,
        "batch_size": batch,
        "input_size": size,
        "eager_step_seconds": statistics.median(eager),
        "schedule_step_seconds": statistics.median(ours),
        "ratio": statistics.median(ratios),
        "first_step_seconds": first,
        "new_shape_first_step_seconds": new_shape,
        "new_shape_step_seconds": again,
        "plans": [p.how for p in wrapped.plans],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50:8:128", "sample:gpt:8:256"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(
        f"{'model':<22} {'eager s':>8} {'ours s':>8} {'ratio':>6} {'first s':>8} "
        f"{'new shape s':>11} {'then s':>7}"
    )
    for entry in args.models:
        spec, batch, size = entry.rsplit(":", 2)
        row = measure(spec, int(batch), int(size), args.repeats)
        rows.append(row)
        print(
            f"{entry:<22} {row['eager_step_seconds']:>8.3f} {row['schedule_step_seconds']:>8.3f} "
            f"{row['ratio']:>6.3f} {row['first_step_seconds']:>8.2f} "
            f"{row['new_shape_first_step_seconds']:>11.2f} {row['new_shape_step_seconds']:>7.3f}"
        )
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "runtime.json"
    out.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
