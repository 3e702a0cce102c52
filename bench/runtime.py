"""Benchmark: what running under the runtime costs, against the unmodified model.

    python bench/runtime.py [--models resnet50:8:128 sample:gpt:8:256] [--repeats 7]
        [--device cpu] [--profile] [--results bench/results]

For each model: the no-recomputation schedule's step time over eager (the runtime's own cost:
Dynamo's guards, AOTAutograd's wrappers, the generated FX code; goal <= 1.02x), the first
step (capture and compile), the first step at a new shape (half the batch, or one more
where half would leave a BatchNorm model too few values per channel: captured again,
the schedule mapped onto the new graph), and a later step at that shape. Beside it, to say
whose cost it is: plain `torch.compile(backend="aot_eager")` (AOTAutograd's runtime, the
graphs run op by op, no plan), and the same under the Dynamo settings the runtime needs on
every call (`explorer.backend.dynamo_settings`), and the same schedule with no operator
writing in place (*functional*: explorer.inplace turned off for its compile). Steps are timed
interleaved (eager, plain, plain under the settings, functional, schedule, then again) on one
thread; the table shows medians of
each step's time over eager's in the same round. On CUDA steps are synchronized. With
--profile, five steps of plain and of the schedule each run under `torch.profiler`, and the
operators whose host (and device) time a step differs most between them are listed: where
the runtime's own cost goes. Writes runtime.json into --results.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

import explorer
from explorer.backend import dynamo_settings, wrap_with_schedule
from explorer.memory import time_step
from explorer.models import build
from explorer.verify import training_step

RESULTS = Path(__file__).parent / "results"
PROFILED_STEPS = 5


@contextlib.contextmanager
def _functional() -> Iterator[None]:
    """The runtime compiling with no operator writing in place (explorer.inplace)."""
    with mock.patch("explorer.backend.mark_in_place", lambda _graph, program: program):
        yield


class _UnderSettings(nn.Module):
    """A compiled model called under the runtime's per-call Dynamo settings."""

    def __init__(self, compiled: nn.Module) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args):
        with dynamo_settings():
            return self.compiled(*args)


def _operator_times(model: nn.Module, inputs: tuple, device: str) -> dict[str, tuple]:
    """Per operator name, (calls, self host microseconds, self device microseconds) a step,
    averaged over PROFILED_STEPS profiled training steps."""
    activities = [ProfilerActivity.CPU]
    if torch.device(device).type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiled:
        for seed in range(PROFILED_STEPS):
            model.zero_grad(set_to_none=True)
            time_step(lambda seed=seed: training_step(model, inputs, seed), device)
    return {
        event.key: tuple(
            value / PROFILED_STEPS
            for value in (event.count, event.self_cpu_time_total, event.self_device_time_total)
        )
        for event in profiled.key_averages()
    }


def operator_differences(plain: nn.Module, ours: nn.Module, inputs: tuple, device: str) -> list:
    """The operators whose self host or device time differs most between a step of `ours`
    and one of `plain` (largest first), each with both sides' calls and times."""
    times = {
        name: _operator_times(m, inputs, device) for name, m in (("plain", plain), ("ours", ours))
    }
    rows = []
    for key in set(times["plain"]) | set(times["ours"]):
        a, b = (times[side].get(key, (0, 0.0, 0.0)) for side in ("plain", "ours"))
        rows.append(
            {
                "operator": key,
                "calls": [a[0], b[0]],
                "host_us": [a[1], b[1]],
                "device_us": [a[2], b[2]],
                "difference_us": (b[1] - a[1]) + (b[2] - a[2]),
            }
        )
    rows.sort(key=lambda row: -abs(row["difference_us"]))
    return rows[:15]


def _print_differences(rows: list) -> None:
    print(f"  {'operator':<44} {'calls':>11} {'host us':>17} {'device us':>17}")
    for row in rows:
        calls = "{:.0f}/{:.0f}".format(*row["calls"])
        host = "{:.0f}/{:.0f}".format(*row["host_us"])
        dev = "{:.0f}/{:.0f}".format(*row["device_us"])
        print(f"  {row['operator'][:44]:<44} {calls:>11} {host:>17} {dev:>17}")


def _other_batch(x: torch.Tensor) -> torch.Tensor:
    """`x` at half its batch, or one more for a batch under 4 (halved, a BatchNorm model
    at batch 2 or 3 refuses its batch of 1)."""
    batch = x.shape[0]
    if batch >= 4:
        return x[: batch // 2]
    return torch.cat([x, x[:1]])


def measure(
    spec: str, batch: int, size: int, repeats: int, device: str, with_profile: bool = False
) -> dict:
    built = build(spec, batch, size, device=device)
    plan = explorer.Planner(built.model, built.example_inputs, spec=built.spec)
    baseline = plan.baseline()
    variants = {
        "eager": copy.deepcopy(built.model),
        "plain": torch.compile(copy.deepcopy(built.model), backend="aot_eager"),
        "settings": _UnderSettings(torch.compile(copy.deepcopy(built.model), backend="aot_eager")),
    }
    wrapped = wrap_with_schedule(copy.deepcopy(built.model), plan.made_for(), baseline.to_dict())
    inputs = built.example_inputs
    other_shape = tuple(_other_batch(x) for x in inputs)

    def seconds(model: nn.Module, batch: tuple, seed: int) -> float:
        model.zero_grad(set_to_none=True)  # as a loop's optimizer.zero_grad() leaves them
        return time_step(lambda: training_step(model, batch, seed), device)

    functional = wrap_with_schedule(copy.deepcopy(built.model), plan.made_for(), baseline.to_dict())
    with _functional():
        seconds(functional, inputs, 0)
    for model in variants.values():  # warm up and compile the comparisons
        seconds(model, inputs, 0)
    variants["functional"] = functional
    first = seconds(wrapped, inputs, 0)
    variants["ours"] = wrapped
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(repeats):
        for name, model in variants.items():
            times[name].append(seconds(model, inputs, r))
    differences = (
        operator_differences(variants["plain"], wrapped, inputs, device) if with_profile else []
    )
    new_shape = seconds(wrapped, other_shape, 0)
    again = statistics.median(seconds(wrapped, other_shape, 0) for _ in range(3))

    def over_eager(name: str) -> float:
        return statistics.median(t / e for e, t in zip(times["eager"], times[name], strict=True))

    return {
        "model": spec,
        "batch_size": batch,
        "input_size": size,
        "device": device,
        "eager_step_seconds": statistics.median(times["eager"]),
        "schedule_step_seconds": statistics.median(times["ours"]),
        "ratio": over_eager("ours"),
        "plain_aot_eager_ratio": over_eager("plain"),
        "aot_eager_under_settings_ratio": over_eager("settings"),
        "functional_ratio": over_eager("functional"),
        "first_step_seconds": first,
        "new_shape_first_step_seconds": new_shape,
        "new_shape_step_seconds": again,
        "plans": [p.how for p in wrapped.plans],
        "operator_differences": differences,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet50:8:128", "sample:gpt:8:256"])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument(
        "--profile", action="store_true", help="list where the schedule's step spends more"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(
        f"{'model':<22} {'eager s':>8} {'ours s':>8} {'ratio':>6} {'plain':>6} {'+sets':>6} "
        f"{'funct':>6} {'first s':>8} {'new shape s':>11} {'then s':>7}"
    )
    for entry in args.models:
        spec, batch, size = entry.rsplit(":", 2)
        row = measure(spec, int(batch), int(size), args.repeats, args.device, args.profile)
        rows.append(row)
        print(
            f"{entry:<22} {row['eager_step_seconds']:>8.3f} {row['schedule_step_seconds']:>8.3f} "
            f"{row['ratio']:>6.3f} {row['plain_aot_eager_ratio']:>6.3f} "
            f"{row['aot_eager_under_settings_ratio']:>6.3f} {row['functional_ratio']:>6.3f} "
            f"{row['first_step_seconds']:>8.2f} "
            f"{row['new_shape_first_step_seconds']:>11.2f} {row['new_shape_step_seconds']:>7.3f}"
        )
        if row["operator_differences"]:
            print("  a step, plain aot_eager / ours:")
            _print_differences(row["operator_differences"])
    args.results.mkdir(parents=True, exist_ok=True)
    out = args.results / "runtime.json"
    out.write_text(json.dumps({"torch": torch.__version__, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
