"""What the runtime itself adds to a training step, measured once when profiling.

A schedule runs the model through `torch.compile` with our backend: Dynamo's guards,
AOTAutograd's wrappers and functional graphs (an out-of-place ReLU where the model wrote an
in-place one, a 1-byte dropout mask and its product instead of a float mask). So even the
schedule that recomputes nothing is not the unmodified model's step: measured on this
project's 2-core CPU machine, 0.98 to 1.09x on resnet50 b8 128 px, 1.00 to 1.12x on
sample:gpt b8 256, 1.01 to 1.21x on mobilenet_v2 b16 96 px, and 1.16x on sample:tiny_cnn b4
32 px, whose 4 ms step shows the runtime's fixed cost per call (the spread is mostly the
machine's: one unmodified resnet50 step took 0.92 to 1.19 s within a minute). The operator
profile cannot see that (it times the graph's operators, not the model's), so the planner
times both whole steps here, interleaved (unmodified, runtime, unmodified, ...) after one
untimed step of each, as many rounds as fit in the timing seconds (explorer.timingrounds),
and a schedule's predicted overhead is that ratio times its predicted seconds over the
no-recompute seconds (explorer.schedule.Schedule.runtime_factor): overheads are against the
unmodified model, as `verify` and the peers measure them.

Both steps are `verify`'s training step (the forward, then a backward from seeded random
gradients of every output that requires grad), from no gradients, on the user's model: `kept`
puts its buffers, gradients, flags and RNG back. The runtime's is called as a wrapped model
is, through `RematModule`'s forward: what every wrapped call does around the compiled step
(Dynamo's settings, the checks for held gradients and activations, the input signature) is
part of the factor. Timed as a plain call of the compiled step, it was not: 0.2 ms a call on
this CPU, 7% of sample:tiny_cnn b4 32 px's 4 ms step, whose no-recompute point was predicted
at +20.9% where verify measured +29% to +31% (both in at most 20 rounds). On the CPU the
runtime's step also times its graphs (the capture's marks at every graph run's start and
end): what a schedule recomputes runs at their pace (explorer.schedule.Schedule).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from explorer.backend import RematBackend, RematModule, compile_call
from explorer.eagerpeaks import START
from explorer.errors import RematWarning, UserError
from explorer.memory import time_step
from explorer.modelstate import device_of, grad_holders, kept
from explorer.pagefaults import faults_of, median_faults
from explorer.progress import CancelToken, check_cancel
from explorer.timingcheck import ratio_spread
from explorer.timingrounds import another_round, timing_seconds
from explorer.verify import step_autocast, training_step

# the least timed rounds after the warm-up round (the ratio's error moves every predicted
# overhead by as much, so more are timed where they fit: explorer.timingrounds)
LEAST_ROUNDS = 1

# the refusal of a step that Dynamo captures again at every call (the planner's too, where
# the recompile limit is reached first)
CAPTURED_AT_EVERY_CALL = (
    "cannot plan this step: torch.compile captures it again at every call "
    "(TORCH_LOGS=recompiles shows why), as a model does whose Python takes another path at "
    "each step (random choices made in Python, such as BigBird's block-sparse attention) or "
    "that changes what its forward reads at each call (a forward hook that appends to a list, "
    "a counter kept on the module): no plan of one step holds for the next, and the step "
    "would compile at every call until Dynamo's recompile limit stops it"
)


@contextlib.contextmanager
def _compiling() -> Iterator[list[None]]:
    """The Dynamo compilations that end inside the block, one entry each."""
    compiles: list[None] = []

    def count(_args: object) -> None:
        compiles.append(None)

    torch._dynamo.callback_handler.register_end_callback(count)
    try:
        yield compiles
    finally:
        torch._dynamo.callback_handler.remove_end_callback(count)


@dataclass
class StepTimes:
    """Median seconds of one training step: the unmodified model's, and the runtime's
    without recomputation; `factor` is their median ratio over the rounds. `graph_seconds`:
    of the runtime's step, the seconds inside its compiled graphs' forwards and backwards,
    where recomputed operators run too (None: not measured, as on CUDA, whose kernels run
    after the Python that queues them). `eager_faults`: the unmodified step's minor page
    faults, the median over its timed steps, on the CPU (explorer.pagefaults; None: not
    counted). `spread`: the interquartile range of the rounds' ratios over their median
    (explorer.timingcheck; None: too few rounds, or not measured)."""

    eager_seconds: float
    runtime_seconds: float
    factor: float
    graph_seconds: float | None = None
    eager_faults: int | None = None
    spread: float | None = None


class _InsideGraphs:
    """A marker (explorer.eagerpeaks) that adds up the seconds between each graph run's
    start and end."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def __call__(self, _kind: str, edge: str) -> None:
        now = time.perf_counter()
        if edge == START:
            self._started = now
        else:
            self.seconds += now - self._started


def measure_step_times(
    model: nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    autocast: torch.dtype | None = None,
    runtime: RematModule | None = None,
    set_marker: Callable[[Callable[[str, str], None] | None], None] | None = None,
    seconds: float | None = None,
    cancel: CancelToken | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> StepTimes:
    """Time the model's training step unmodified and under the runtime with no schedule
    (every graph runs without recomputation), interleaved (see the module docstring), the
    latter called as a wrapped model is (RematModule.over), with the work a wrapped call
    does around the compiled step. `runtime`: such a step already compiled (the capture's),
    else one is compiled; `set_marker`: its backend's marks at every graph run's start and
    end (the capture's), which time the graphs inside it on the CPU; `seconds`: of timed
    rounds (explorer.timingrounds.timing_seconds() when None)."""
    seconds = timing_seconds() if seconds is None else seconds
    device = device_of(model, (args, kwargs))
    made_here = runtime is None
    if runtime is None:
        backend = RematBackend([])  # no schedules: nothing is recomputed
        runtime = RematModule.over(model, backend, compile_call(backend), args, kwargs)
    holders = grad_holders(model, (args, kwargs))

    def step(forward: Callable[..., Any]) -> Callable[[], None]:
        def run() -> None:
            for tensor in holders:
                tensor.grad = None
            training_step(forward, args, 0, kwargs, loss=loss)

        return run

    eager_step = step(model)
    compiled: list[bool] = []  # whether each runtime step compiled (captured the model again)

    inside: list[float] = []  # each runtime step's seconds inside its graphs
    marking = set_marker is not None and device.type == "cpu"

    def runtime_step() -> None:
        clock = _InsideGraphs()
        if marking:
            set_marker(clock)
        try:
            with _compiling() as compiles:
                step(runtime)()
        finally:
            if marking:
                set_marker(None)
        compiled.append(bool(compiles))
        inside.append(clock.seconds)

    eager: list[float] = []
    ours: list[float] = []
    faults: list[int | None] = []  # of each timed unmodified step
    with kept(model, (args, kwargs)), step_autocast(device, autocast), warnings.catch_warnings():
        # what a wrapped call warns of (a graph run more often than a plan counts) is the
        # planner's to say, not the timing's
        warnings.simplefilter("ignore", RematWarning)
        time_step(eager_step, device)  # warm-up (and the runtime's backward is compiled)
        time_step(runtime_step, device)
        while another_round(eager, ours, LEAST_ROUNDS, seconds):
            check_cancel(cancel)
            taken, faulted = faults_of(lambda: time_step(eager_step, device))
            eager.append(taken)
            faults.append(faulted)
            ours.append(time_step(runtime_step, device))
    # the warm-up's compilation counts where the runtime was made elsewhere (the capture's,
    # which compiled the step already); a runtime made here compiles at its first step
    steps = compiled[1:] if made_here else compiled
    if steps and all(steps):
        raise UserError(CAPTURED_AT_EVERY_CALL)
    ratios = [b / a for a, b in zip(eager, ours, strict=True) if a > 0]
    return StepTimes(
        eager_seconds=statistics.median(eager),
        runtime_seconds=statistics.median(ours),
        factor=statistics.median(ratios) if ratios else 1.0,
        graph_seconds=statistics.median(inside[1:]) if marking else None,  # after the warm-up
        eager_faults=median_faults(faults) if device.type == "cpu" else None,
        spread=ratio_spread(ratios),
    )
