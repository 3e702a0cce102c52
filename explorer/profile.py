"""Time every operator of the step on the model's device and save it as JSON.

Each node runs on real tensors produced by running the step in order (the no-recompute
program), on copies of the parameters and buffers so that profiling never changes the model.
Timing: the whole step once untimed, then `repeats` times, each operator timed where it runs
(median of its calls); CUDA events with synchronization on GPU, the wall clock on CPU. On
CUDA the allocator's peak during a call, minus the bytes of its outputs, is the operator's
workspace. A profile is keyed by the graph's fingerprint and the
device: loading it for another graph or device is refused.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from explorer.capture import CapturedGraph
from explorer.eagerpeaks import EagerPeaks
from explorer.errors import RematWarning, UserError
from explorer.execute import op_table, store
from explorer.files import (
    optional_count,
    optional_seconds,
    optional_share,
    read_json,
    write_atomic,
)
from explorer.fxgraph import is_tangent
from explorer.graph import Graph
from explorer.memory import requested_bytes
from explorer.program import StepProgram, baseline_schedule, compile_program
from explorer.progress import CancelToken, ProgressFn, check_cancel, report
from explorer.stepcost import StepTimes

SCHEMA = 2


@dataclass
class Profile:
    """Seconds (and workspace bytes) per operator, for one graph on one device."""

    fingerprint: str
    device: str
    device_name: str
    seconds: dict[str, float]
    workspace: dict[str, int] = field(default_factory=dict)
    graph: Graph | None = None
    # what code outside the graphs holds for a moment around this run (a profile lists a
    # graph once per run of it in the step; explorer.eagerpeaks)
    eager: EagerPeaks = field(default_factory=EagerPeaks)
    # set by the planner, neither measured nor saved: False when every step starts with the
    # gradients of the one before, which autograd adds to in place and never copies
    # (Planner(gradients_held=True); explorer.graph.Graph.grad_copy_bytes)
    layout_copies: bool = True
    # set by the planner too: the tangents autograd hands this graph's backward (a loss's
    # gradient of an output, a later graph's), freed after their last use rather than held
    # through the backward as a user's are (explorer.program.Handoff.handed_tangents)
    handed_tangents: frozenset[str] = frozenset()

    def time_of(self, node: str) -> float:
        return self.seconds.get(node, 0.0)

    def to_dict(self) -> dict:
        return {
            "fingerprint": self.fingerprint,
            "seconds": self.seconds,
            "workspace": self.workspace,
            "graph": self.graph.to_dict() if self.graph is not None else None,
            "eager": self.eager.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict, device: str, device_name: str) -> Profile:
        return cls(
            fingerprint=str(data["fingerprint"]),
            device=device,
            device_name=device_name,
            seconds={str(k): float(v) for k, v in data["seconds"].items()},
            workspace={str(k): int(v) for k, v in data.get("workspace", {}).items()},
            graph=Graph.from_dict(data["graph"]) if data.get("graph") else None,
            eager=EagerPeaks.from_dict(data.get("eager")),
        )


@dataclass
class StepProfile:
    """The profiles of every graph of a step, measured on one device: `profile.json`.

    `step_times`: the whole step timed unmodified and under the runtime without
    recomputation (explorer.stepcost); None where nothing ran (the analytic cost model, or a
    profile.json written before it was measured): schedules then predict their overhead
    against the no-recompute step."""

    graphs: list[Profile]
    device: str
    device_name: str
    torch_version: str = torch.__version__
    step_times: StepTimes | None = None
    loss: str | None = None  # the name of the loss the step backpropagated (Planner(loss=...))
    # the moments were measured on a step that starts with gradients (Planner(gradients_held=
    # True)): then autograd copies none after the backward; a plan either way may use either
    # profile (a plan that holds them, with one that does not, counts a copy never made)
    gradients_held: bool = False
    # one step of the model as it is, measured as verify measures it (explorer.unmodified);
    # None where nothing ran or profile.json predates it
    unmodified_peak_bytes: int | None = None

    @property
    def runtime_factor(self) -> float:
        """The runtime's no-recompute step over the unmodified model's (1.0: not measured)."""
        return self.step_times.factor if self.step_times is not None else 1.0

    @property
    def runtime_seconds(self) -> float | None:
        """The runtime's no-recompute step, in seconds (None: not measured)."""
        return self.step_times.runtime_seconds if self.step_times is not None else None

    @property
    def graph_seconds(self) -> float | None:
        """Of that step, the seconds inside its graphs (None: not measured)."""
        return self.step_times.graph_seconds if self.step_times is not None else None

    @property
    def fingerprint(self) -> str:
        return "+".join(p.fingerprint for p in self.graphs)

    @property
    def total_seconds(self) -> float:
        return sum(sum(p.seconds.values()) for p in self.graphs)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "fingerprint": self.fingerprint,
            "device": self.device,
            "device_name": self.device_name,
            "torch_version": self.torch_version,
            "graphs": [p.to_dict() for p in self.graphs],
            "step_times": asdict(self.step_times) if self.step_times is not None else None,
            "loss": self.loss,
            "gradients_held": self.gradients_held,
            "unmodified_peak_bytes": self.unmodified_peak_bytes,
        }

    def save(self, path: str | Path) -> Path:
        return write_atomic(Path(path), json.dumps(self.to_dict()))

    @classmethod
    def load(
        cls, path: str | Path, *, fingerprint: str | None = None, device: str | None = None
    ) -> StepProfile:
        """Read a profile.json; refuse one made for other graphs or another device."""
        data = read_json(Path(path), what="profile")
        if data.get("schema") != SCHEMA:
            raise UserError(f"{path}: profile schema {data.get('schema')!r} is not {SCHEMA}")
        try:
            dev, name = str(data["device"]), str(data["device_name"])
            profile = cls(
                graphs=[Profile.from_dict(g, dev, name) for g in data["graphs"]],
                device=dev,
                device_name=name,
                torch_version=str(data.get("torch_version", "")),
                step_times=_step_times(data.get("step_times")),
                loss=None if data.get("loss") is None else str(data["loss"]),
                gradients_held=bool(data.get("gradients_held", False)),
                unmodified_peak_bytes=optional_count(data.get("unmodified_peak_bytes")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"{path}: not a valid profile ({type(exc).__name__}: {exc})") from exc
        if not profile.graphs:
            raise UserError(f"{path}: not a valid profile (no graphs)")
        if fingerprint is not None and profile.fingerprint != fingerprint:
            raise UserError(
                f"{path}: profile is for graph {profile.fingerprint}, this model traces to "
                f"{fingerprint}: profile this model again"
            )
        if device is not None and _device_kind(profile.device) != _device_kind(device):
            raise UserError(f"{path}: profile was made on {profile.device}, not {device}")
        if any("eager" not in g for g in data["graphs"]):
            warnings.warn(
                f"remat-explorer: {path} was saved before profiling measured what code "
                "outside the graphs holds; planned as if it held nothing there: profile again "
                "to count it",
                RematWarning,
                stacklevel=2,
            )
        return profile


def _step_times(data: dict | None) -> StepTimes | None:
    """The measured step times of a profile.json (raises on a damaged entry)."""
    if data is None:
        return None
    times = StepTimes(
        float(data["eager_seconds"]),
        float(data["runtime_seconds"]),
        float(data["factor"]),
        optional_seconds(data.get("graph_seconds")),  # these three absent in older files
        optional_count(data.get("eager_faults"), "page faults"),
        optional_share(data.get("spread")),
    )
    measured = [times.eager_seconds, times.runtime_seconds, times.factor]
    if not all(math.isfinite(t) and t > 0 for t in measured):
        raise ValueError(f"step times {data!r}")
    return times


def _device_kind(device: str) -> str:
    return torch.device(device).type


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


class _Timer:
    """Times one call: CUDA events on GPU, the wall clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self, fn) -> tuple[float, object]:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 1000.0, out
        begin = time.perf_counter()
        out = fn()
        return time.perf_counter() - begin, out


def _workspace(device: torch.device, fn, out_bytes: int) -> int:
    """Bytes an operator asks the CUDA allocator for beyond its outputs (cuDNN and cuBLAS
    workspaces), as requested: the allocator's rounding is not the operator's."""
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize()
    base = requested_bytes(device)[0]
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return max(0, requested_bytes(device)[1] - base - out_bytes)


def profile_graph(
    captured: CapturedGraph,
    *,
    repeats: int = 3,
    progress: ProgressFn | None = None,
    cancel: CancelToken | None = None,
) -> Profile:
    """Time every operator of one captured graph where it runs: the whole no-recompute step,
    run in order on copies of its inputs, once untimed and then `repeats` times; an
    operator's seconds are the median of its calls.

    Timed alone (a warm-up, then its calls back to back), operators read differently from
    what they cost inside the step, both ways and by up to ten times: resnet50 b8 128 px's
    last BatchNorm backward took 29.5 ms alone and 3.0 ms in the step, its convolution
    backwards 30 to 60% more in the step than alone. In the step the sum of its operators'
    seconds met the step's own time (1.473 s against 1.488 s; alone, 1.329 s)."""
    graph = captured.graph
    device = _device_of(captured)
    program = compile_program(graph, baseline_schedule(graph), fuse_dropouts=False)
    ops = op_table(captured.joint.graph)
    instrs = program.forward + program.backward
    static = _static_values(captured)
    layouts = _tangent_layouts(captured)
    timer = _Timer(device)
    times: dict[str, list[float]] = {instr.node: [] for instr in instrs}
    workspace: dict[str, int] = {}
    calls = (repeats + 1) * len(instrs)
    with torch.no_grad():
        for run in range(repeats + 1):
            slots = _step_inputs(program, graph, static, layouts, device)
            for k, instr in enumerate(instrs):
                check_cancel(cancel)
                call = lambda instr=instr, slots=slots: ops[instr.node](slots, instr.in_slots)  # noqa: E731
                elapsed, result = timer(call)
                if run:
                    times[instr.node].append(elapsed)
                else:
                    ws = _workspace(device, call, graph.node(instr.node).out_bytes)
                    if ws:
                        workspace[instr.node] = ws
                store(slots, instr, result)
                for slot in instr.frees:
                    slots[slot] = None
                done = run * len(instrs) + k + 1
                if k % 8 == 0 or done == calls:
                    report(progress, done * len(instrs) // calls, len(instrs), "profiling")
    seconds = {node: statistics.median(values) for node, values in times.items()}
    return Profile(graph.fingerprint(), str(device), device_name(device), seconds, workspace, graph)


def _step_inputs(
    program: StepProgram,
    graph: Graph,
    static: list[torch.Tensor],
    layouts: dict[str, tuple[int, ...]],
    device: torch.device,
) -> list:
    """Slots holding the graph's inputs and tangents of ones, ready for one step; each tangent
    laid out as traced (`layouts`), as the runtime hands it over."""
    slots: list = [None] * len(program.slot_of)
    for slot, tensor in zip(program.static_slots, static, strict=True):
        slots[slot] = tensor
    for node in graph.placeholders("tangent"):
        meta = node.outputs[0]
        dtype = getattr(torch, meta.dtype.split(".")[-1])
        tangent = torch.empty_strided(meta.shape, layouts[node.name], dtype=dtype, device=device)
        slots[program.slot_of[(node.name, 0)]] = tangent.fill_(1)
    return slots


def _tangent_layouts(captured: CapturedGraph) -> dict[str, tuple[int, ...]]:
    """The strides the joint graph traced each tangent with: those of its output, which
    AOTAutograd gives the tangent before the backward runs. The backward may view them so
    (BigBird's: a transposed attention output's tangent, viewed as (batch, length, width),
    which a contiguous tangent cannot be: profiling failed)."""
    return {
        fxn.name: tuple(fxn.meta["val"].stride())
        for fxn in captured.joint.graph.find_nodes(op="placeholder")
        if is_tangent(fxn)
    }


def _static_values(captured: CapturedGraph) -> list[torch.Tensor]:
    """Copies of the graph's inputs and constants, in the IR's placeholder order."""
    primals = iter(captured.primals)
    values = []
    for node in captured.joint.graph.nodes:
        if node.op == "placeholder" and not is_tangent(node):
            values.append(next(primals).detach().clone())
        elif node.op == "get_attr":
            values.append(getattr(captured.joint, node.target).detach().clone())
    return values


def _device_of(captured: CapturedGraph) -> torch.device:
    first = next((p for p in captured.primals if isinstance(p, torch.Tensor)), None)
    return first.device if first is not None else torch.device("cpu")
