"""Time every operator of the step on the model's device and save it as JSON.

Each node runs on real tensors produced by running the step in order (the no-recompute
program), on copies of the parameters and buffers so that profiling never changes the model.
Timing: a warm-up call, then `repeats` calls, median; CUDA events with synchronization on GPU,
the wall clock on CPU. On CUDA the allocator's peak during a call, minus the bytes of its
outputs, is the operator's workspace. A profile is keyed by the graph's fingerprint and the
device: loading it for another graph or device is refused.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from explorer.capture import Capture
from explorer.errors import UserError
from explorer.execute import op_table, store
from explorer.graph import Graph
from explorer.program import baseline_schedule, compile_program
from explorer.progress import CancelToken, ProgressFn, check_cancel, report

SCHEMA = 1


@dataclass
class Profile:
    """Seconds (and workspace bytes) per operator, for one graph on one device."""

    fingerprint: str
    device: str
    device_name: str
    seconds: dict[str, float]
    workspace: dict[str, int] = field(default_factory=dict)
    graph: Graph | None = None
    torch_version: str = torch.__version__

    def time_of(self, node: str) -> float:
        return self.seconds.get(node, 0.0)

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "fingerprint": self.fingerprint,
            "device": self.device,
            "device_name": self.device_name,
            "torch_version": self.torch_version,
            "seconds": self.seconds,
            "workspace": self.workspace,
            "graph": self.graph.to_dict() if self.graph is not None else None,
        }

    def save(self, path: str | Path) -> Path:
        from explorer.files import write_atomic

        return write_atomic(Path(path), json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path, *, fingerprint: str | None = None, device: str | None = None):
        """Read a profile; refuse one made for another graph or device."""
        from explorer.files import read_json

        data = read_json(Path(path), what="profile")
        try:
            if data.get("schema") != SCHEMA:
                raise UserError(f"{path}: profile schema {data.get('schema')} is not {SCHEMA}")
            profile = cls(
                fingerprint=str(data["fingerprint"]),
                device=str(data["device"]),
                device_name=str(data["device_name"]),
                seconds={str(k): float(v) for k, v in data["seconds"].items()},
                workspace={str(k): int(v) for k, v in data.get("workspace", {}).items()},
                graph=Graph.from_dict(data["graph"]) if data.get("graph") else None,
                torch_version=str(data.get("torch_version", "")),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"{path}: not a valid profile ({type(exc).__name__}: {exc})") from exc
        if fingerprint is not None and profile.fingerprint != fingerprint:
            raise UserError(
                f"{path}: profile is for graph {profile.fingerprint}, this model traces to "
                f"{fingerprint}: profile this model again"
            )
        if device is not None and _device_kind(profile.device) != _device_kind(device):
            raise UserError(f"{path}: profile was made on {profile.device}, not {device}")
        return profile


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
    if device.type != "cuda":
        return 0
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return max(0, torch.cuda.max_memory_allocated(device) - base - out_bytes)


def profile_step(
    cap: Capture,
    static: list[torch.Tensor],
    *,
    repeats: int = 3,
    progress: ProgressFn | None = None,
    cancel: CancelToken | None = None,
) -> Profile:
    """Profile every operator. `static` = parameters, buffers, inputs (they are copied)."""
    graph = cap.graph
    device = static[0].device if static else torch.device("cpu")
    program = compile_program(graph, baseline_schedule(graph))
    ops = op_table(cap.fx_graph)
    slots: list = [None] * len(program.slot_of)
    with torch.no_grad():
        for slot, tensor in zip(program.static_slots, static, strict=True):
            slots[slot] = tensor.detach().clone()
        for node in graph.placeholders("tangent"):
            meta = node.outputs[0]
            slots[program.slot_of[(node.name, 0)]] = torch.ones(
                meta.shape, dtype=getattr(torch, meta.dtype.split(".")[-1]), device=device
            )
        instrs = program.forward + program.backward
        timer = _Timer(device)
        seconds: dict[str, float] = {}
        workspace: dict[str, int] = {}
        for k, instr in enumerate(instrs):
            check_cancel(cancel)
            call = lambda instr=instr: ops[instr.node](slots, instr.in_slots)  # noqa: E731
            timer(call)  # warm-up
            times = []
            for _ in range(repeats):
                elapsed, result = timer(call)
                times.append(elapsed)
            seconds[instr.node] = statistics.median(times)
            ws = _workspace(device, call, graph.node(instr.node).out_bytes)
            if ws:
                workspace[instr.node] = ws
            store(slots, instr, result)
            for slot in instr.frees:
                slots[slot] = None
            if k % 8 == 0 or k == len(instrs) - 1:
                report(progress, k + 1, len(instrs), f"profiling {instr.node}")
    return Profile(graph.fingerprint(), str(device), device_name(device), seconds, workspace, graph)
