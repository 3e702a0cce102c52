"""Small shared helpers for the engine tests."""

from __future__ import annotations

import copy
import importlib.util
import math
import sys
import uuid
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch import nn

import explorer
from explorer import planner as planner_module
from explorer.backend import wrap_with_schedule
from explorer.inplace import IN_PLACE
from explorer.memory import LiveBytesTracker
from explorer.models import build
from explorer.program import operator_of
from explorer.rngreplay import REPLAYS
from explorer.schedule import Schedule
from explorer.simulate import EAGER
from explorer.verify import VerifyReport, training_step

REPLAYED = {str(mask): str(replay) for mask, replay in REPLAYS.items()}
FUNCTIONAL_OF = {str(in_place): str(functional) for functional, in_place in IN_PLACE.items()}

__all__ = [
    "assert_lowest_point_trains_like_the_model",
    "import_schedule",
    "live_bytes_by_operator",
    "PassBlock",
    "Passes",
    "planner",
    "train_step",
]

train_step = training_step  # the same step verify runs: seeded forward, random tangents


def planner(spec: str, batch: int, size: int | None) -> explorer.Planner:
    built = build(spec, batch, size)
    return explorer.Planner(built.model, built.example_inputs, spec=built.spec)


def assert_lowest_point_trains_like_the_model(plan: explorer.Planner) -> VerifyReport:
    """Sweep four budgets: the lowest point keeps less than no recomputation, and one training
    step under it equals the model's bitwise (outputs, parameter gradients, and buffers where
    the model has any) within its predicted peak (verify's checks). Returns verify's report."""
    front = plan.sweep(points=4)
    point = front.points[0]
    assert point.predicted_peak_bytes < front.baseline_peak_bytes
    report = point.schedule.verify()
    assert report.ok, report.format_table()
    rows = {r.quantity: r for r in report.rows}
    assert rows["outputs"].measured == "bitwise equal"
    assert rows["parameter gradients"].measured == "bitwise equal"
    buffers = rows.get("buffers (BatchNorm statistics)")
    assert buffers is None or buffers.measured == "bitwise equal"
    return report


def runtimes_timed(monkeypatch: pytest.MonkeyPatch) -> list:
    """The list to which every runtime step a profile times is appended from now on (the
    profile's timing shortened to 0.1 s)."""
    timed = []
    measure = planner_module.measure_step_times

    def recording(*args, runtime, **kwargs):
        timed.append(runtime)
        return measure(*args, runtime=runtime, **kwargs)

    monkeypatch.setattr(planner_module, "measure_step_times", recording)
    monkeypatch.setenv("REMAT_EXPLORER_TIMING_SECONDS", "0.1")
    return timed


def import_schedule(path: str | Path) -> ModuleType:
    """Import a Python file (an exported schedule) the way a training script does."""
    name = f"schedule_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def live_bytes_by_operator(
    plan: explorer.Planner, schedule: Schedule, inputs: tuple, kwargs: dict | None = None
) -> list[tuple[str, int, int]]:
    """(operator, predicted, measured) live bytes after every operator of the predicted
    timeline, for the wrapped model's second step (the first compiles). The graphs' operators
    that ran (those called by a graph's code: not eager code's between graphs, which may run
    operators of the same names) are matched to the prediction's in order by their aten name;
    they include more (views the graphs make), and every predicted one must be found."""
    wrapped = wrap_with_schedule(copy.deepcopy(plan.model), plan.made_for(), schedule.to_dict())
    training_step(wrapped, inputs, 0, kwargs, loss=plan.loss)
    for parameter in wrapped.parameters():
        parameter.grad = None
    ran: list[tuple[str, int]] = []

    def after_op(name: str, live: int) -> None:
        if _called_by_graph_code():
            ran.append((name, live))

    with LiveBytesTracker(after_op=after_op, held=[*wrapped.parameters(), *wrapped.buffers()]):
        training_step(wrapped, inputs, 0, kwargs, loss=plan.loss)
    line = plan.timeline(schedule)
    graphs = plan.capture()
    predicted = []
    for label, live, phase in zip(line.labels, line.steps, line.phase, strict=True):
        # not a graph's operator: a copy autograd makes, a moment of code outside the graphs
        if "autograd:" not in label and EAGER not in label:
            where, _, name = label.rpartition(":")
            graph = graphs[int(where[1:]) - 1 if where else 0]
            target = operator_of(graph, name)
            if phase == "recompute":  # a mask drawn again runs its replaying twin
                target = REPLAYED.get(target, target)
            predicted.append((label, target, live - line.static_bytes))
    found: list[tuple[str, int, int]] = []
    for name, live in ran:
        # an operator that writes in place runs its in-place overload (explorer.inplace)
        functional = FUNCTIONAL_OF.get(name, name)
        if len(found) < len(predicted) and functional == predicted[len(found)][1]:
            label, _, expected = predicted[len(found)]
            found.append((label, expected, live))
    assert len(found) == len(predicted), f"{predicted[len(found)][0]} never ran"
    return found


def assert_as_predicted(rows: list[tuple[str, int, int]]) -> None:
    """Every operator's measured live bytes equal to the predicted (rows of
    `live_bytes_by_operator`), the first mismatches named."""
    wrong = [row for row in rows if row[1] != row[2]]
    assert not wrong, f"{len(wrong)} operators (operator, predicted, measured): {wrong[:3]}"


def _called_by_graph_code() -> bool:
    """Whether the operator being dispatched was called, at any depth, by a planned graph's
    code: the runtime runs the code FX generates for each graph, whose file is
    '<eval_with_key>.N'. Not a graph without gradients (code under no_grad, which the runtime
    runs as AOTAutograd traced it, its file '<eval_with_key>.N from .../proxy_tensor.py ...'):
    its operators are eager code's to the plan (a custom Function's forward)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<eval_with_key>"):
            return " from " not in name
        frame = frame.f_back
    return False


class PassBlock(nn.Module):
    """A residual MLP: recomputing its activation saves memory."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(32, 128), nn.Linear(128, 32)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(x)).sin())


class Passes(nn.Module):
    """Blocks applied in a loop that Dynamo splits at every pass (a graph break inside), so
    the loop runs eagerly and the blocks' forward is compiled on its own: a graph for the
    first block, then one more, which every later block runs. `shared`: the first block
    applied at every pass (a layer called again). Inputs: (batch, 32)."""

    def __init__(self, passes: int, shared: bool = False) -> None:
        super().__init__()
        self.passes = passes
        self.shared = shared
        self.blocks = nn.ModuleList(PassBlock() for _ in range(4))

    def forward(self, x):
        blocks = [self.blocks[0]] * self.passes if self.shared else self.blocks[: self.passes]
        for block in blocks:
            torch._dynamo.graph_break()
            x = block(x)
        return x


class Attention(nn.Module):
    """One causal self-attention: fused (`scaled_dot_product_attention`) or written out."""

    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused
        self.qkv = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(x).view(batch, tokens, 3, 2, 8).permute(2, 0, 3, 1, 4)
        if self.fused:
            return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum()
        scores = q @ k.transpose(-2, -1) / math.sqrt(8)
        causal = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).tril()
        return (scores.masked_fill(~causal, -math.inf).softmax(-1) @ v).sum()


class LayerOfItsOwn(nn.Module):
    """A recurrent layer in a module of its own: Dynamo calls it, a break it resumes after."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x):
        return self.rnn(x)[0]


class RecurrentInTheMiddle(nn.Module):
    """Layers, an nn.LSTM (in a module of its own or not), layers: Dynamo runs the LSTM
    eagerly, and, met as an attribute, the rest of the forward too."""

    def __init__(self, own: bool) -> None:
        super().__init__()
        self.embed = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        rnn = nn.LSTM(8, 8, batch_first=True)
        self.rnn = LayerOfItsOwn(rnn) if own else rnn
        self.head = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        h = self.embed(x)
        h = self.rnn(h) if isinstance(self.rnn, LayerOfItsOwn) else self.rnn(h)[0]
        return self.head(h)


class RangeObserved(nn.Module):
    """Keeps the per-channel least value of its features as quantization-aware training's
    observers keep their ranges (an empty buffer `resize_`d at the first call), and counts
    its calls in a buffer it assigns anew at each (`self.calls = self.calls + 1`)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 2)
        self.register_buffer("low", torch.tensor([]))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        h = torch.relu(self.conv(x))
        with torch.no_grad():
            low = h.amin(dim=(0, 2, 3))
            self.low.resize_(low.shape)
            self.low.copy_(low)
        self.calls = self.calls + 1
        return self.head(h.mean(dim=(2, 3)))
