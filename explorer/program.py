"""Turn a schedule into straight-line programs with explicit frees.

Both the simulator (which predicts memory) and the runtime (which executes) read the same
`StepProgram`, so what is predicted to be alive is exactly what the runtime keeps alive.
Values live in numbered slots; each instruction lists the slots to clear after it runs.
A value is freed right after its last reader; a value nobody reads is freed right after it is
made. A recomputed value overwrites the slot of the value it recomputes (whose readers are
all earlier, so it is already free).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.graph import BACKWARD, EFFECT, FORWARD, PLACEHOLDER, ROLE_TANGENT, Graph, ValueRef
from explorer.schedule import Schedule


@dataclass
class Instr:
    node: str
    in_slots: list[int]
    out_slots: list[int | None]  # None: output that is not a tensor
    frees: list[int] = field(default_factory=list)
    recompute: bool = False


@dataclass
class StepProgram:
    """Slots, the forward and backward instruction lists, and what crosses between them."""

    slot_of: dict[ValueRef, int]
    static_slots: list[int]  # params, buffers, inputs: never freed by us
    forward: list[Instr]
    saved_slots: list[int]  # alive from the end of the forward into the backward
    output_slots: list[int]  # model outputs, handed to the user
    tangent_slots: list[int]
    backward: list[Instr]
    grad_slots: list[int | None]  # one per graph input (parameters, buffers, inputs)
    unread_saved: list[int] = field(default_factory=list)  # saved but never read: freed first


def _slot_table(graph: Graph) -> dict[ValueRef, int]:
    table: dict[ValueRef, int] = {}
    for node in graph.nodes:
        for i, meta in enumerate(node.outputs):
            if meta is not None:
                table[(node.name, i)] = len(table)
    return table


def _assign_frees(instrs: list[Instr], keep: set[int], initially_live: set[int]) -> list[int]:
    """Fill each instruction's `frees`: a value is cleared after its last reader, or right after
    it is written if nothing reads it. Slots in `keep` survive to the end of the list. Returns
    the initially live slots that nothing reads (cleared before the first instruction)."""
    before_first: list[int] = []
    current: dict[int, tuple[int, int]] = {s: (-1, -1) for s in initially_live}  # written, read

    def finish(slot: int, written: int, read: int) -> None:
        end = max(written, read)
        (before_first if end < 0 else instrs[end].frees).append(slot)

    for k, instr in enumerate(instrs):
        for s in instr.in_slots:
            current[s] = (current.get(s, (-1, -1))[0], k)
        for s in instr.out_slots:
            if s is None:
                continue
            if s in current and s not in keep:
                finish(s, *current[s])
            current[s] = (k, -1)
    for s, (written, read) in current.items():
        if s not in keep:
            finish(s, written, read)
    for instr in instrs:
        instr.frees = sorted(set(instr.frees))
    return sorted(set(before_first))


def _instr(graph: Graph, table: dict[ValueRef, int], name: str, recompute: bool) -> Instr:
    node = graph.node(name)
    return Instr(
        node=name,
        in_slots=[table[r] for r in node.inputs],
        out_slots=[None if m is None else table[(name, i)] for i, m in enumerate(node.outputs)],
        recompute=recompute,
    )


def compile_program(graph: Graph, schedule: Schedule) -> StepProgram:
    """Lower a schedule into forward and backward instruction lists with frees."""
    table = _slot_table(graph)
    static = [
        table[(n.name, 0)]
        for n in graph.nodes
        if n.phase == PLACEHOLDER and n.role != ROLE_TANGENT and n.outputs[0] is not None
    ]
    tangents = [table[(n.name, 0)] for n in graph.placeholders(ROLE_TANGENT)]
    outputs = [table[r] for r in graph.model_outputs if r is not None]
    saved = [table[r] for r in schedule.saved]

    forward = [
        _instr(graph, table, n.name, False) for n in graph.nodes if n.phase in (FORWARD, EFFECT)
    ]
    keep_fwd = set(static) | set(saved) | set(outputs)
    _assign_frees(forward, keep_fwd, set())

    phase = {n.name: n.phase for n in graph.nodes}
    backward = [_instr(graph, table, name, phase[name] == FORWARD) for name in schedule.backward]
    grads = [None if r is None else table[r] for r in graph.input_grads]
    # autograd holds the tangents for the whole backward, so they are never ours to free
    keep_bwd = set(static) | set(outputs) | set(tangents) | {g for g in grads if g is not None}
    unread = _assign_frees(backward, keep_bwd, set(saved) | set(tangents))
    return StepProgram(table, static, forward, saved, outputs, tangents, backward, grads, unread)


def check_program(graph: Graph, program: StepProgram) -> str | None:
    """Why this program cannot run (a value read before it exists), or None if it can."""
    live = set(program.static_slots)
    missing = _first_unready(program.forward, live)
    if missing:
        return f"forward: {missing} reads a value not yet computed"
    live = set(program.static_slots) | set(program.saved_slots) | set(program.tangent_slots)
    live |= set(program.output_slots)
    live -= set(program.unread_saved)
    missing = _first_unready(program.backward, live)
    if missing:
        return f"backward: {missing} reads a value that is not alive"
    absent = [g for g in program.grad_slots if g is not None and g not in live]
    return "backward: a parameter gradient is missing at the end" if absent else None


def _first_unready(instrs: list[Instr], live: set[int]) -> str | None:
    """Replay liveness (updating `live`); the first node that reads a dead slot, if any."""
    for instr in instrs:
        if any(s not in live for s in instr.in_slots):
            return instr.node
        live.update(s for s in instr.out_slots if s is not None)
        live.difference_update(instr.frees)
    return None


def baseline_schedule(graph: Graph) -> Schedule:
    """Keep every forward value the backward reads; recompute nothing (what eager does)."""
    backward_nodes = [n for n in graph.nodes if n.phase == BACKWARD]
    forward_names = {n.name for n in graph.nodes if n.phase in (FORWARD, EFFECT, PLACEHOLDER)}
    saved: list[ValueRef] = []
    for node in backward_nodes:
        for ref in node.inputs:
            producer = graph.node(ref[0])
            if ref[0] in forward_names and producer.phase == FORWARD and ref not in saved:
                saved.append(ref)
    return Schedule(graph.fingerprint(), saved, [n.name for n in backward_nodes])
