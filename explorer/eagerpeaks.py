"""What the model's own code outside the graphs allocates for a moment, measured once a step.

The plan has a point after every graph operator. Code that runs between two graphs' operators
(the model's eager code between graphs and after the last one, the tangents the training step
draws, autograd's backward of that code) can hold more for a moment than at either point: a
loss computed eagerly after the last graph keeps its large intermediate and makes its
gradient before any graph's backward runs (tests/test_eagerpeaks.py: a model whose forward
ends in `exp` outside the graph measured 1,131,264 bytes where 132,616 were predicted).
None of that depends on the schedule, only on what the graphs leave at the moment the
stretch begins, which the plan knows: so one training step of the runtime without
recomputation is measured with marks where each graph run's forward and backward start and
end, and each stretch's highest point above its start becomes a point of the plan
(explorer.simulate): the runs' `EagerPeaks`. So is what a stretch leaves for good that the
autograd graph does not show: the gradients a custom Function's backward makes by running
autograd itself, for parameters the step's autograd graph never reaches (Reformer's
reversible layers; explorer.eager.unreached_parameters), counted from that stretch to the
step's end (explorer.step).

Measured with the live-tensor meter on CPU (explorer.memory) and the allocator's requested
bytes on CUDA. A step whose graphs run otherwise than the capture recorded (a count of
forward or backward runs that differs) keeps no measurement for what does not match: zero,
as for a profile made without running (the analytic cost model) or saved before this.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
from torch import nn

from explorer.memory import LiveBytesTracker, requested_bytes
from explorer.modelstate import STEP_SEED, clear_grads, device_of, kept

FORWARD, BACKWARD = "forward", "backward"
START, END = "start", "end"


@dataclass(frozen=True)
class EagerPeaks:
    """Bytes above the level where a stretch outside one graph run's operators began, at the
    stretch's highest point: from the step's start to this run's forward (the step's first run
    only), from this run's forward return to the next graph operator, and from its backward's
    return to the next."""

    before: int = 0
    after_forward: int = 0
    after_backward: int = 0
    # bytes of gradients that the stretch after this run's forward (the last run's: eager code
    # after it, and its backward) or backward leaves, for parameters the step's autograd graph
    # does not reach (a custom Function whose backward runs autograd itself: Reformer's
    # reversible layers); alive to the step's end
    grads_after_forward: int = 0
    grads_after_backward: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict | None) -> EagerPeaks:
        data = data or {}
        values = {f.name: int(data.get(f.name, 0)) for f in fields(cls)}
        if any(v < 0 for v in values.values()):
            raise ValueError(f"negative eager peak {data!r}")
        return cls(**values)


# (forward|backward, start|end, bytes now, most since last, bytes of the gradients of the
# parameters the autograd graph does not reach, now)
Reading = tuple[str, str, int, int, int]


def peaks_from_readings(readings: list[Reading], start: int, runs: int) -> list[EagerPeaks]:
    """Each run's EagerPeaks from the marks of one step, in the order they came: forward runs
    in the order the capture recorded them, backward runs in reverse (each graph's backward
    after the later graphs'), then a last reading with the kind "" at the step's end. `start`:
    the bytes at the step's start. Parts whose counts do not match `runs` stay zero."""
    forwards = [k for k, r in enumerate(readings) if r[0] == FORWARD and r[1] == END]
    backwards = [k for k, r in enumerate(readings) if r[0] == BACKWARD and r[1] == END]
    before = [0] * runs
    after_forward = [0] * runs
    after_backward = [0] * runs
    grads_after_forward = [0] * runs
    grads_after_backward = [0] * runs

    def left(k: int) -> int:  # the unreached parameters' gradients made after mark k
        return max(0, readings[k + 1][4] - readings[k][4])

    def above(k: int) -> int:  # the highest point after mark k, above the level at k
        return max(0, readings[k + 1][3] - readings[k][2])

    if len(forwards) == runs and runs:
        before[0] = max(0, readings[0][3] - start)
        for run, k in enumerate(forwards):
            after_forward[run] = above(k)
            grads_after_forward[run] = left(k)
    if len(backwards) == runs:
        for j, k in enumerate(backwards):
            after_backward[runs - 1 - j] = above(k)
            grads_after_backward[runs - 1 - j] = left(k)
    parts = zip(
        before,
        after_forward,
        after_backward,
        grads_after_forward,
        grads_after_backward,
        strict=True,
    )
    return [EagerPeaks(*p) for p in parts]


class _Meter:
    """The bytes alive now and the most since the last reading."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._most = 0
        self._tracker: LiveBytesTracker | None = None

    @contextmanager
    def watching(self) -> Iterator[_Meter]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield self
            return
        self._tracker = LiveBytesTracker(self.device, after_op=self._seen)
        with self._tracker:
            yield self
        self._tracker = None

    def _seen(self, _name: str, live: int) -> None:
        self._most = max(self._most, live)

    def read(self) -> tuple[int, int]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            now, most = requested_bytes(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return now, most
        assert self._tracker is not None
        now = self._tracker.current_bytes
        most, self._most = max(self._most, now), now
        return now, most


def measure_eager_peaks(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    runtime: Callable[..., Any],
    set_marker: Callable[[Callable[[str, str], None] | None], None],
    runs: int,
    autocast: torch.dtype | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
    gradients_held: bool = False,
    unreached: list[torch.Tensor] | None = None,
) -> list[EagerPeaks]:
    """One training step of `runtime` (the capture's compiled step, without recomputation,
    already run once so that nothing compiles now), from no gradients (`kept` puts the
    model's back), with `set_marker(mark)` making the runtime call `mark(kind, edge)` at every
    graph run's forward and backward start and end. `gradients_held`: the step measured
    starts with the gradients of one before it, as in gradient accumulation (autograd then
    adds into them and copies none laid out otherwise than their parameters). `unreached`:
    the parameters the step's autograd graph does not reach, whose gradients each stretch
    leaves are counted (`EagerPeaks.grads_after_backward`)."""
    unreached = unreached or []
    # the runtime's modules import this one (for EagerPeaks): these come in when measuring
    from explorer.backend import dynamo_settings
    from explorer.verify import step_autocast, training_step

    device = device_of(model, (args, kwargs))
    meter = _Meter(device)
    readings: list[Reading] = []

    def graded() -> int:
        grads = [p.grad for p in unreached if p.grad is not None]
        return sum(g.untyped_storage().nbytes() for g in grads)

    def mark(kind: str, edge: str) -> None:
        readings.append((kind, edge, *meter.read(), graded()))

    def step() -> None:
        training_step(lambda *a, **k: runtime(model, *a, **k), args, STEP_SEED, kwargs, loss=loss)

    with (
        kept(model, (args, kwargs), STEP_SEED),
        dynamo_settings(),
        step_autocast(device, autocast),
    ):
        clear_grads(model, (args, kwargs))
        if gradients_held:  # the gradients a step before it left
            step()
        with meter.watching():
            start, _ = meter.read()
            set_marker(mark)
            try:
                step()
            finally:
                set_marker(None)
            readings.append(("", "", *meter.read(), graded()))
    return peaks_from_readings(readings, start, runs)
