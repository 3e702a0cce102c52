"""Turn a schedule into straight-line programs with explicit frees.

Both the simulator (which predicts memory) and the runtime (which executes) read the same
`StepProgram`, so what is predicted to be alive is exactly what the runtime keeps alive.
Values live in numbered slots; each instruction lists the slots to clear after it runs.
A value is freed right after its last reader; a value nobody reads is freed right after it is
made. A recomputed value overwrites the slot of the value it recomputes (whose readers are
all earlier, so it is already free).

A dropout split so that its mask can be drawn again (explorer.rewrite.compact_dropout: a
generator snapshot, the mask, two multiplications) runs as one `native_dropout` where the
schedule draws its mask once: its snapshot read by nothing else, its mask and output kept or
recomputed from the mask like any value. The runtime makes the same fusion in the forward graph
it runs (`explorer.rewrite.fuse_kept_dropouts`), so a fused dropout holds its mask and output
and nothing else, as `native_dropout` does.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field, replace

from explorer.graph import (
    BACKWARD,
    EFFECT,
    FORWARD,
    PLACEHOLDER,
    ROLE_TANGENT,
    Graph,
    TensorMeta,
    ValueRef,
    storage_owners,
)
from explorer.schedule import GraphSchedule

# the operators of a split dropout (explorer.rewrite), as the IR names them
RNG_STATE = "remat_explorer.rng_state.default"
MASKS = ("remat_explorer.bernoulli_mask.default", "remat_explorer.cuda_dropout_mask.default")
MUL = "aten.mul.Tensor"
NATIVE_DROPOUT = "aten.native_dropout.default"
FUSED_PREFIX = "native_dropout_of_"  # a fused dropout's name: this, then its mask's


@dataclass
class Instr:
    node: str
    in_slots: list[int]
    out_slots: list[int | None]  # None: output that is not a tensor
    frees: list[int] = field(default_factory=list)
    recompute: bool = False
    # a fused dropout: the split's snapshot, mask, product and output nodes it runs as one
    # `native_dropout(x)`, which makes the output and the mask (out_slots, in that order)
    fused: tuple[str, ...] = ()
    # writes its output into its first input's storage, which it is the last to read
    # (explorer.inplace)
    in_place: bool = False

    @property
    def parts(self) -> tuple[str, ...]:
        """The graph's nodes this instruction runs."""
        return self.fused or (self.node,)


def outputs_of(graph: Graph, instr: Instr) -> list[TensorMeta | None]:
    """What an instruction makes: its node's outputs, or a fused dropout's output and mask."""
    if not instr.fused:
        return graph.node(instr.node).outputs
    _, mask, _, output = instr.fused
    return [graph.node(output).outputs[0], graph.node(mask).outputs[0]]


def operator_of(graph: Graph, name: str) -> str:
    """The ATen operator an instruction named `name` runs (a fused dropout's is not a node)."""
    return NATIVE_DROPOUT if name.startswith(FUSED_PREFIX) else graph.node(name).target


@dataclass
class EagerCode:
    """What the model's eager code (operators Dynamo left outside every graph: a frame it runs
    eagerly, found by explorer.eager) leaves to a step around one of its graphs, in bytes.

    `saved`: what the code just before this graph saves for its backward, held from this graph's
    forward to the end of its backward. `kept`: what that code saves of the graphs' own tensors (a
    graph's output or input the user does not hold: the graph run that first has it, its value
    there, its bytes), which the frames hold through the forward: kept from the forward's return to
    the end of this graph's backward, where that run's schedule does not keep it longer. `outputs`:
    what that code returns to the user, and what a custom autograd.Function there puts on its ctx,
    alive from this graph's forward to the end of the step. `grads`: the gradients that code makes
    for parameters no graph reads, alive from the end of this graph's backward. `waiting`: gradients
    held in autograd's buffers through this graph's backward, made after it (by eager code or a
    later graph) for what eager code or an earlier graph made before it. `backward`: alive through
    every graph's backward (counted on the last graph): what the code after the last graph returns
    and the gradients it makes for parameters no graph reads, and the user's tangents for every
    output eager code made. `locals`: what the frames of the model's code hold as this graph starts
    beyond all that and the graphs' own tensors (a zeroed tensor eager code fills, a loop's random
    draws: explorer.frames), held through this graph's forward."""

    saved: int = 0
    kept: tuple[tuple[int, ValueRef, int], ...] = ()
    outputs: int = 0
    grads: int = 0
    waiting: int = 0
    backward: int = 0
    locals: int = 0


@dataclass(frozen=True)
class Handoff:
    """How one graph of a step made of several meets the others (explorer.step).

    `transient_inputs`: placeholders that an earlier graph made and that are not the user's:
    the Python frames between the graphs hold them until the model's forward returns (measured:
    a three-graph step kept both handed-over tensors through the last graph's forward), then
    they live on only if this graph saves them. `passed_on`: outputs that only
    later graphs read: freed when this graph's forward ends (the next graph counts them), unless
    this graph's schedule keeps them for its backward. `sources`: for each transient input,
    the earlier graph and the output of it that it is (so that a step does not count it twice
    while that graph keeps it). `handed_tangents`: the tangents that autograd makes and hands
    to this graph's backward, which nobody else holds: a later graph's gradient for an output
    only later graphs read, zeros for an output nobody holds (a frame's local), and the sum of
    the user's tangent and a later graph's gradient for an output both hold (its name also in
    `user_tangents_too`: the user's own tangent is alive beside it). Freed after their last use
    here, where the user's tangents live through the whole backward, unless
    `handed_tangents_kept`: AOTAutograd before torch 2.13 keeps every tangent of a graph
    through that graph's backward (measured on 2.11 and 2.12: a two-graph step peaked one
    handed-over tangent above the prediction made for 2.13 and 2.14). `params_read_later`:
    parameters that a later graph of the step reads too (a layer called again): the later
    graph's gradient for one already holds `.grad` when this graph's backward runs, and this
    graph's is added into it, so the step counts one gradient, the later graph's. `dropped`:
    outputs that neither the user nor a later graph holds (a local of the model's eager code,
    which may read it): the Python frames hold them until the model's forward returns, then
    they live on only if this graph saves them; `released`: those of them, and of the transient
    inputs this graph is the first to read (eager code's or an earlier graph's), that no frame
    held, nor eager code saved, when a later graph (its number in the step) past their last
    reader started: freed before that graph's forward instead. `kept_by_eager`: this graph's
    tensors that eager code before it saves (`EagerCode.kept`): where this backward reads one,
    it stays to this backward's end (autograd holds it for that code's backward, which runs
    next). `read_earlier`: transient inputs that eager code made and an earlier graph read
    too (T5's position bias, read by every layer's graph), each with the first graph to read
    it and its name there: that graph counts it through the forward, and through its own
    backward (which runs after this one's) where it saves it.
    `eager`: what the model's eager code around this graph leaves to the step."""

    transient_inputs: frozenset[str] = frozenset()
    passed_on: frozenset[ValueRef] = frozenset()
    sources: tuple[tuple[str, int, ValueRef], ...] = ()
    handed_tangents: frozenset[str] = frozenset()
    handed_tangents_kept: bool = False
    user_tangents_too: frozenset[str] = frozenset()
    params_read_later: frozenset[str] = frozenset()
    eager: EagerCode = field(default_factory=EagerCode)
    dropped: frozenset[ValueRef] = frozenset()
    released: tuple[tuple[ValueRef, int], ...] = ()
    kept_by_eager: frozenset[ValueRef] = frozenset()
    read_earlier: tuple[tuple[str, int, str], ...] = ()

    def freed_tangents(self) -> frozenset[str]:
        """The handed tangents freed after their last use here (none where the runtime
        keeps them): what a solver of this graph alone must know of its tangents."""
        return frozenset() if self.handed_tangents_kept else self.handed_tangents


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
    transient_slots: list[int] = field(default_factory=list)  # Handoff.transient_inputs
    # transient inputs and dropped outputs the backward does not read: freed when the step's
    # forward ends
    frame_held: list[int] = field(default_factory=list)
    passed_on_slots: list[int] = field(default_factory=list)  # freed when the forward ends
    # passed on, and read by the backward too: kept past the forward (the user holds neither)
    saved_passed_on: list[int] = field(default_factory=list)
    # alive to the end of the backward, then let go: handed-over tangents the runtime keeps
    # (Handoff.handed_tangents_kept), tensors eager code keeps (Handoff.kept_by_eager)
    kept_to_end_slots: list[int] = field(default_factory=list)
    frame_released: dict[int, int] = field(default_factory=dict)  # Handoff.released, slots


def storage_slots(
    graph: Graph, slot_of: dict[ValueRef, int], values: Collection[ValueRef]
) -> set[int]:
    """The slots of every value that shares a storage with one of `values` (a value and its
    views: a graph saves the detached alias of its output, a backward reads a transpose)."""
    if not values:  # most graphs: no storage walk on every compile
        return set()
    owner = storage_owners(graph)
    roots = {owner.get(r, r) for r in values}
    return {slot for r, slot in slot_of.items() if owner.get(r, r) in roots}


def _slot_table(graph: Graph) -> dict[ValueRef, int]:
    """A slot for each tensor value, in graph order (made once per graph: `_slots`)."""
    table: dict[ValueRef, int] = {}
    for node in graph.nodes:
        for i, meta in enumerate(node.outputs):
            if meta is not None:
                table[(node.name, i)] = len(table)
    return table


def _node_slots(graph: Graph) -> dict[str, tuple[tuple[int, ...], tuple[int | None, ...]]]:
    """Each node's input and output slots (None: an output that is not a tensor)."""
    table = _slots(graph)
    return {
        node.name: (
            tuple(table[r] for r in node.inputs),
            tuple(None if m is None else table[(node.name, i)] for i, m in enumerate(node.outputs)),
        )
        for node in graph.nodes
    }


def _slots(graph: Graph) -> dict[ValueRef, int]:
    return graph.derived("program.slot_table", _slot_table)


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


def _instr(slots: dict[str, tuple[tuple, tuple]], name: str, recompute: bool) -> Instr:
    ins, outs = slots[name]
    return Instr(node=name, in_slots=list(ins), out_slots=list(outs), recompute=recompute)


def compile_program(
    graph: Graph,
    schedule: GraphSchedule,
    handoff: Handoff | None = None,
    fuse_dropouts: bool = True,
) -> StepProgram:
    """Lower a schedule into forward and backward instruction lists with frees.

    Work whose result nobody reads is left out first (`prune`), as FX leaves it out of the
    graphs the runtime runs, so the program is exactly what runs. `handoff` says which inputs
    and outputs are only passing through, when the step has several graphs. Split dropouts
    whose mask is drawn once run fused (see the module docstring), unless `fuse_dropouts` is
    False: profiling times each of the graph's operators."""
    schedule = prune(graph, schedule)
    handoff = handoff or Handoff()
    table = _slots(graph)
    slots = graph.derived("program.node_slots", _node_slots)
    placeholders = [
        n
        for n in graph.nodes
        if n.phase == PLACEHOLDER and n.role != ROLE_TANGENT and n.outputs[0] is not None
    ]
    transient = [table[(n.name, 0)] for n in placeholders if n.name in handoff.transient_inputs]
    static = [table[(n.name, 0)] for n in placeholders if n.name not in handoff.transient_inputs]
    tangent_nodes = graph.placeholders(ROLE_TANGENT)
    tangents = [table[(n.name, 0)] for n in tangent_nodes]
    outputs = [table[r] for r in graph.model_outputs if r is not None]
    saved = [table[r] for r in schedule.saved]

    phase = {n.name: n.phase for n in graph.nodes}
    backward = [_instr(slots, name, phase[name] == FORWARD) for name in schedule.backward]
    read_later = {s for instr in backward for s in instr.in_slots}
    bw_transient = [s for s in transient if s in read_later]
    passed_on = [table[r] for r in handoff.passed_on if table[r] not in read_later]
    saved_passed_on = [table[r] for r in handoff.passed_on if table[r] in read_later]

    needed = forward_needed(graph, set(schedule.saved))
    forward = [_instr(slots, n.name, False) for n in graph.nodes if n.name in needed]
    keep_fwd = set(static) | set(saved) | set(outputs) | set(transient)
    _assign_frees(forward, keep_fwd, set(transient))
    if fuse_dropouts:
        forward = _fuse_dropouts(graph, forward)
    dropped = {table[r] for r in handoff.dropped}
    frame_held = [s for s in [*transient, *sorted(dropped)] if s not in read_later]
    frame_released = {table[r]: k for r, k in handoff.released if table[r] in frame_held}

    grads = [None if r is None else table[r] for r in graph.input_grads]
    kept_outputs = set(outputs) - set(passed_on) - set(saved_passed_on) - dropped
    # the user's tangents (held by their caller) live through the whole backward; those of
    # outputs only later graphs read come from their backwards through autograd, which hands
    # them over: freed after their last use here (measured), unless the runtime keeps them
    handed = {
        slot
        for slot, node in zip(tangents, tangent_nodes, strict=True)
        if node.name in handoff.handed_tangents
    }
    handed_kept = sorted(handed) if handoff.handed_tangents_kept else []
    held_tangents = (set(tangents) - handed) | set(handed_kept)
    # what eager code keeps past this backward, and this backward reads (through any view of
    # its storage): alive to its end
    eager_kept = sorted(storage_slots(graph, table, handoff.kept_by_eager) & read_later)
    keep_bwd = set(static) | kept_outputs | held_tangents | {g for g in grads if g is not None}
    keep_bwd |= set(eager_kept)
    unread = _assign_frees(backward, keep_bwd, set(saved) | set(tangents) | set(bw_transient))
    return StepProgram(
        table,
        static,
        forward,
        saved,
        outputs,
        tangents,
        backward,
        grads,
        unread,
        transient,
        frame_held,
        passed_on,
        saved_passed_on,
        [*handed_kept, *eager_kept],
        frame_released,
    )


def _fuse_dropouts(graph: Graph, forward: list[Instr]) -> list[Instr]:
    """`forward` with each split dropout whose snapshot and product nothing else reads (not
    kept for the backward) as one fused instruction."""
    fused: list[Instr] = []
    k = 0
    while k < len(forward):
        one = _fused_dropout(graph, forward, k)
        fused.append(one or forward[k])
        k += 4 if one else 1
    return fused


def _fused_dropout(graph: Graph, forward: list[Instr], k: int) -> Instr | None:
    """The four instructions of a split dropout from `forward[k]` on as one, or None if none
    starts there or a part of it is read by anything but the next part. (Called at every
    forward instruction of every schedule a search simulates: most are no snapshot, and
    are answered from their own target alone.)"""
    if graph.node(forward[k].node).target != RNG_STATE or k + 4 > len(forward):
        return None
    state, mask, product, output = run = forward[k : k + 4]
    targets = [graph.node(i.node).target for i in run[1:]]
    if targets[0] not in MASKS or targets[1:] != [MUL, MUL]:
        return None
    (x,) = state.in_slots
    snapshot, drawn, made = state.out_slots[0], mask.out_slots[0], product.out_slots[0]
    if mask.in_slots[0] != snapshot or product.in_slots != [x, drawn]:
        return None
    if output.in_slots != [made] or snapshot not in mask.frees or made not in output.frees:
        return None
    frees = {s for i in run for s in i.frees} - {snapshot, made}
    return Instr(
        node=FUSED_PREFIX + mask.node,
        in_slots=[x],
        out_slots=[output.out_slots[0], drawn],
        frees=sorted(frees),
        fused=(state.node, mask.node, product.node, output.node),
    )


def prune(graph: Graph, schedule: GraphSchedule) -> GraphSchedule:
    """The schedule without backward work whose outputs nobody reads (a recomputation made
    for nothing), and with exactly the saved values the remaining backward reads."""
    wanted = {r for r in graph.input_grads if r is not None}
    kept: list[str] = []
    for name in reversed(schedule.backward):
        node = graph.node(name)
        made = {(name, i) for i in range(len(node.outputs))}
        if made & wanted:
            kept.append(name)
            wanted -= made
            wanted.update(node.inputs)
    kept.reverse()
    if len(kept) == len(schedule.backward):
        return schedule
    forward = {n.name for n in graph.nodes if n.phase == FORWARD}
    return replace(
        schedule,
        saved=read_before_made(graph, kept, forward),
        backward=kept,
        recomputed=list(dict.fromkeys(n for n in kept if n in forward)),
    )


def read_before_made(graph: Graph, order: list[str], forward: Collection[str]) -> list[ValueRef]:
    """Values made by `forward` operators that `order` reads before (or without) making them
    again: what a schedule with that backward order must save."""
    made_again: set[ValueRef] = set()
    saved: dict[ValueRef, None] = {}  # ordered, and a set for the membership test
    for name in order:
        for ref in graph.node(name).inputs:
            if ref[0] in forward and ref not in made_again:
                saved.setdefault(ref)
        if name in forward:
            made_again.update((name, i) for i in range(len(graph.node(name).outputs)))
    return list(saved)


def forward_needed(graph: Graph, saved: set[ValueRef]) -> set[str]:
    """The forward operators that run: those the model outputs, the saved values, the buffer
    updates and the random draws depend on. A value that only the backward reads, and that the
    schedule recomputes there instead of saving, is not computed in the forward at all (the
    forward graph the partition builds leaves it out the same way)."""
    roots = [r[0] for r in graph.model_outputs if r is not None] + [r[0] for r in saved]
    roots += [n.name for n in graph.nodes if n.phase == EFFECT or (n.phase == FORWARD and n.random)]
    needed: set[str] = set()
    while roots:
        name = roots.pop()
        node = graph.node(name)
        if name in needed or node.phase not in (FORWARD, EFFECT):
            continue
        needed.add(name)
        roots.extend(ref[0] for ref in node.inputs)
    return needed


def check_program(graph: Graph, program: StepProgram) -> str | None:
    """Why this program cannot run (a value read before it exists), or None if it can."""
    live = set(program.static_slots) | set(program.transient_slots)
    missing = _first_unready(program.forward, live)
    if missing:
        return f"forward: {missing} reads a value not yet computed"
    live -= set(program.passed_on_slots) | set(program.frame_held)
    live |= set(program.static_slots) | set(program.saved_slots) | set(program.tangent_slots)
    live |= set(program.output_slots) - set(program.passed_on_slots) - set(program.frame_held)
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


def baseline_schedule(graph: Graph) -> GraphSchedule:
    """Keep every forward value the backward reads; recompute nothing (what eager does)."""
    return schedule_from_order(graph, [n.name for n in graph.nodes if n.phase == BACKWARD])


def schedule_from_saved(graph: Graph, keep: set[ValueRef]) -> GraphSchedule:
    """A schedule that keeps `keep` (plus every pinned value the backward needs) and recomputes
    any other forward value right before its first reader in the backward, in the traced order;
    a recomputed value lives until its last reader. Valid for any `keep`: this is how a plan is
    carried over to a graph it was not made for."""
    forward = {n.name: n for n in graph.nodes if n.phase == FORWARD}
    available = {ref for ref in keep if ref[0] in forward}
    available |= {ref for ref in graph.model_outputs if ref is not None}  # the user holds them
    order: list[str] = []

    def make(ref: ValueRef) -> None:
        if ref in available or ref[0] not in forward:
            return
        node = forward[ref[0]]
        if node.pinned:
            available.add(ref)  # kept from the forward: never recomputed
            return
        for source in node.inputs:
            make(source)
        order.append(node.name)
        available.update((node.name, i) for i in range(len(node.outputs)))

    for node in graph.nodes:
        if node.phase == BACKWARD:
            for ref in node.inputs:
                make(ref)
            order.append(node.name)
    return schedule_from_order(graph, order)


def schedule_from_order(graph: Graph, order: list[str]) -> GraphSchedule:
    """The schedule that runs `order` as its backward (its backward operators and the forward
    ones it makes again, as often as it names them), saving what it reads before making."""
    forward = {n.name for n in graph.nodes if n.phase == FORWARD}
    saved = read_before_made(graph, order, forward)
    recomputed = list(dict.fromkeys(name for name in order if name in forward))
    return GraphSchedule(
        graph.fingerprint(), saved, order, recomputed=recomputed, structure=graph.structure()
    )
