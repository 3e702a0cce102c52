"""Replay a step program and account memory exactly as the runtime will hold it.

Memory is counted in storages: a view shares its base's storage, and a storage is freed when
the last value using it is cleared. Parameters, buffers and inputs are the static part. Model
outputs stay alive through the backward (the user's loss holds them); tangents (the gradients
of the outputs) are alive for the whole backward (autograd holds them while our backward runs).
The timeline has one entry per operator: the bytes alive just after it ran, before its dead
inputs are cleared, which is when an operator's memory peaks (an operator that writes in place,
explorer.inplace, makes nothing new), plus the scratch memory it used
while running when a (CUDA) profile measured one. Where the profile measured code outside the
graph holding more for a moment (explorer.eagerpeaks), an entry labelled `eager: ...` adds
that to what the graph holds when the stretch begins: before the forward, after it, after the
backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from explorer.eagerpeaks import EagerPeaks
from explorer.graph import PLACEHOLDER, ROLE_TANGENT, Graph
from explorer.program import Instr, StepProgram, outputs_of

EAGER = "eager: "  # the label prefix of a point of code outside the graph
BEFORE_FORWARD = EAGER + "before the forward"


@dataclass
class LastReader:
    """An instruction that is the last to read its first input's storage, which an earlier
    instruction of the same list (forward or backward) made and no other value shares: it
    could write its output there (explorer.inplace). `entry`: its entry in the timeline."""

    instr: Instr
    entry: int
    storage_bytes: int


@dataclass
class Timeline:
    """Bytes alive after each operator of a step, forward then backward."""

    steps: list[int]
    labels: list[str]
    phase: list[str]  # "forward" | "backward" | "recompute"
    static_bytes: int
    held_bytes: int = 0  # alive beyond the static bytes when the forward ends (saved, outputs)
    # of those, the transient inputs that only the Python frames hold: freed when the whole
    # step's forward ends (explorer.step), before any backward
    frame_bytes: int = 0
    # of those, what the frames let go before a later graph's forward, by that graph's number
    # in the step (Handoff.released)
    released: dict[int, int] = field(default_factory=dict)
    # outputs passed on to later graphs that stay alive after the forward (saved for the
    # backward): their slots; a later graph does not count them again (explorer.step)
    kept_passed_on: frozenset[int] = frozenset()
    # alive when the backward ends beyond the static bytes and the gradients it returns: the
    # outputs the user holds and their tangents (alive through earlier graphs' backwards too)
    user_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        return max(self.steps, default=self.static_bytes)

    @property
    def forward_end(self) -> int:
        """Index of the first entry of the backward: a backward operator, or a recomputation
        (a backward may start with one: in a step of several graphs it runs after the later
        graphs' backwards, not in the forward)."""
        return next(
            (i for i, phase in enumerate(self.phase) if phase != "forward"), len(self.phase)
        )


class _Storages:
    """Reference-counted storages behind slots."""

    def __init__(self) -> None:
        self.bytes_of: dict[int, int] = {}
        self.refs: dict[int, int] = {}
        self.storage_of_slot: dict[int, int] = {}
        self.live = 0

    def bind(self, slot: int, nbytes: int, alias_slot: int | None) -> None:
        if alias_slot is not None and alias_slot in self.storage_of_slot:
            sid = self.storage_of_slot[alias_slot]
        else:
            sid = len(self.bytes_of)
            self.bytes_of[sid] = nbytes
            self.refs[sid] = 0
            self.live += nbytes
        self.refs[sid] += 1
        old = self.storage_of_slot.get(slot)
        self.storage_of_slot[slot] = sid
        if old is not None:
            self._drop(old)

    def clear(self, slot: int) -> None:
        sid = self.storage_of_slot.pop(slot, None)
        if sid is not None:
            self._drop(sid)

    def _drop(self, sid: int) -> None:
        self.refs[sid] -= 1
        if self.refs[sid] == 0:
            self.live -= self.bytes_of[sid]


def _run(
    graph: Graph,
    instrs: list[Instr],
    mem: _Storages,
    timeline: Timeline,
    tag: str,
    workspace: dict[str, int],
    last_readers: list[LastReader] | None,
) -> None:
    made_here = len(mem.bytes_of)  # storages numbered from here on are made by this list
    for instr in instrs:
        if last_readers is not None:
            sid = _sole_dying_first_input(mem, instr)
            if sid is not None and sid >= made_here:
                last_readers.append(LastReader(instr, len(timeline.steps), mem.bytes_of[sid]))
        for k, (slot, meta) in enumerate(
            zip(instr.out_slots, outputs_of(graph, instr), strict=True)
        ):
            if slot is None or meta is None:
                continue
            alias = instr.in_slots[meta.alias_of] if meta.alias_of is not None else None
            if instr.in_place and k == 0:
                alias = instr.in_slots[0]
            mem.bind(slot, meta.nbytes, alias)
        timeline.steps.append(mem.live + workspace.get(instr.node, 0))
        timeline.labels.append(instr.node)
        timeline.phase.append("recompute" if instr.recompute else tag)
        for slot in instr.frees:
            mem.clear(slot)


def _sole_dying_first_input(mem: _Storages, instr: Instr) -> int | None:
    """The storage of the instruction's first input where this instruction is its last reader
    and reads it once, and no other slot holds it; else None."""
    if not instr.in_slots or instr.fused:
        return None
    first = instr.in_slots[0]
    if first not in instr.frees or instr.in_slots.count(first) > 1:
        return None
    sid = mem.storage_of_slot.get(first)
    return sid if sid is not None and mem.refs[sid] == 1 else None


def simulate(
    graph: Graph,
    program: StepProgram,
    workspace: dict[str, int] | None = None,
    held_elsewhere: frozenset[str] = frozenset(),
    eager: EagerPeaks | None = None,
    layout_copies: bool = True,
    last_readers: list[LastReader] | None = None,
) -> Timeline:
    """Memory timeline of one graph's step under `program` (see explorer.step for a step made
    of several graphs).

    `workspace` (from a CUDA profile) adds each operator's scratch memory while it runs.
    `held_elsewhere`: transient inputs that an earlier graph (their maker, or another reader)
    counts while this graph needs them (explorer.step): zero bytes here. `eager`: what code
    outside the graph holds for a moment around it (module docstring). `layout_copies`: False
    when the step starts with gradients, which autograd adds to in place, copying none
    (Graph.grad_copy_bytes). `last_readers`, if given, collects the instructions that could
    write in place (LastReader)."""
    workspace = workspace or {}
    eager = eager or EagerPeaks()
    mem = _Storages()
    transient: list[tuple[int, int]] = []
    for node in graph.nodes:
        if node.phase == PLACEHOLDER and node.role != ROLE_TANGENT and node.outputs[0]:
            slot = program.slot_of[(node.name, 0)]
            if slot in program.transient_slots:
                nbytes = 0 if node.name in held_elsewhere else node.outputs[0].nbytes
                transient.append((slot, nbytes))
            else:
                mem.bind(slot, node.outputs[0].nbytes, None)
    timeline = Timeline([], [], [], mem.live)
    _eager_point(timeline, mem.live, eager.before, BEFORE_FORWARD, "forward")
    for slot, nbytes in transient:  # alive, but made by an earlier graph: not static
        mem.bind(slot, nbytes, None)
    _run(graph, program.forward, mem, timeline, "forward", workspace, last_readers)
    _eager_point(timeline, mem.live, eager.after_forward, EAGER + "after the forward", "forward")
    storages = {slot: mem.storage_of_slot.get(slot) for slot in program.passed_on_slots}
    for slot in program.passed_on_slots:
        mem.clear(slot)
    timeline.kept_passed_on = frozenset(
        slot for slot, sid in storages.items() if sid is not None and mem.refs[sid] > 0
    ) | frozenset(program.saved_passed_on)
    timeline.held_bytes = mem.live - timeline.static_bytes
    for slot, run in sorted(program.frame_released.items(), key=lambda item: item[1]):
        alive = mem.live
        mem.clear(slot)
        timeline.released[run] = timeline.released.get(run, 0) + alive - mem.live
    for slot in program.frame_held:
        mem.clear(slot)
    timeline.frame_bytes = timeline.static_bytes + timeline.held_bytes - mem.live
    for node in graph.placeholders(ROLE_TANGENT):
        mem.bind(program.slot_of[(node.name, 0)], node.out_bytes, None)
    for slot in program.unread_saved:
        mem.clear(slot)
    _run(graph, program.backward, mem, timeline, "backward", workspace, last_readers)
    _eager_point(timeline, mem.live, eager.after_backward, EAGER + "after the backward", "backward")
    for slot in program.kept_to_end_slots:  # the user never held them
        if slot not in program.grad_slots:  # (unless returned as a gradient as they are)
            mem.clear(slot)
    grads = {mem.storage_of_slot.get(slot) for slot in program.grad_slots if slot is not None}
    grads.discard(None)
    returned = sum(mem.bytes_of[sid] for sid in grads if mem.refs[sid] > 0)
    timeline.user_bytes = mem.live - timeline.static_bytes - returned
    copy = graph.grad_copy_bytes() if layout_copies else 0
    if copy:
        timeline.steps.append(mem.live + copy)
        timeline.labels.append("autograd: gradient layout copy")
        timeline.phase.append("backward")
    return timeline


def _eager_point(timeline: Timeline, live: int, above: int, label: str, phase: str) -> None:
    """A moment of code outside the graph: `above` bytes over the `live` ones (if any)."""
    if above:
        timeline.steps.append(live + above)
        timeline.labels.append(label)
        timeline.phase.append(phase)
