"""A training step made of one or more captured graphs: one plan per graph, one memory account.

Dynamo gives one graph for most models; code it cannot trace splits a model into several graphs
run one after another, with eager Python between them. The step then runs the graphs' forwards
in order and their backwards in reverse order. While graph k runs, the earlier graphs hold what
their forwards kept (saved tensors, and outputs the user holds). The user's outputs of every
graph and their tangents (drawn before any backward runs) are alive through every backward, and
the later graphs' parameter gradients through k's. A tensor that one graph makes and later
graphs read (`Handoff`) is counted once: by its maker while the maker keeps it for its own
backward, else by an earlier reader that saves it, else by its first reader (and through the
graphs between its maker and a first reader further on than the next). The Python frames between
the graphs hold it until the model's forward returns, or until the first graph after its last
reader whose start finds no frame holding it (`Handoff.released`); after that only a graph that
saves it keeps it. Its tangent comes from the later backwards through autograd, which hands it
over: freed after its last use in the maker's backward (kept to the backward's end before torch
2.13). So do the tangent of an output nobody holds (zeros, made as the maker's backward starts)
and, for an output the user holds and a later graph reads, autograd's sum of the user's tangent
and that graph's gradient, the user's own tangent alive beside it. An output nobody holds, the
frames hold until the forward returns. A later graph's gradient for an earlier one's output
(handed over, or one the user holds too: T5's encoder output, read by every decoder layer's
graph) waits, held by autograd, for the maker's backward, from the last reader's on (a reader in
between adds its own into it): read with eager code's from the autograd graph. What the model's
eager code between the graphs holds (`EagerCode`, explorer.eager) is counted where it lives, and
the moments when code outside the graphs holds more, measured when profiling
(explorer.eagerpeaks), are points on top of what the graphs hold as each begins; the gradients
such code leaves for parameters the autograd graph does not reach, measured there too, are alive
from where it made them to the step's end. The parameters, buffers and the user's inputs are
counted once for the whole step (`static_bytes`), however many graphs read them, and so is model
state that no graph reads (it is memory all the same). With one graph all of this reduces to
that graph's own simulation plus that unread state and what eager code holds around it. Measured
after every operator of a three-graph step, of a loop's graph run at every pass and of eager
code between graphs, the prediction is exact (tests/test_backend.py).

A graph the step runs several times (Dynamo runs one graph at every pass of a loop it split)
is a graph of the step for each run, all runs under its one schedule (the runtime has one per
compiled graph): one solver serves them, and the step's seconds count each run.

The plans for such a step come from explorer.stepsolver, which reads its peaks from here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

from explorer.eagerpeaks import EagerPeaks
from explorer.graph import ROLE_TANGENT, Graph, ValueRef, storage_owners
from explorer.inplace import mark_in_place
from explorer.program import EagerCode, Handoff, StepProgram, compile_program, storage_slots
from explorer.schedule import GraphSchedule
from explorer.simulate import BEFORE_FORWARD, Timeline, simulate

T = TypeVar("T")

MEMO_SIZE = 20000  # programs and simulations of runs kept by a step's solver


def step_timeline(
    graphs: list[Graph],
    schedules: list[GraphSchedule],
    static_bytes: int,
    workspace: list[dict[str, int]] | None = None,
    handoffs: list[Handoff] | None = None,
    moments: list[EagerPeaks] | None = None,
    layout_copies: bool = True,
    memo: dict | None = None,
    labelled: bool = True,
    constants: list[int] | None = None,
) -> Timeline:
    """Bytes alive after each operator of the whole step (see the module docstring), and at
    the highest moments of code outside the graphs (`moments`, per run: explorer.eagerpeaks).
    `layout_copies`: False when the step starts with gradients (explorer.simulate). `memo`:
    each run's program and simulation kept across calls for the same graphs and settings
    (explorer.stepsolver.StepSolver: a search simulates the same schedule of a run many
    times).
    `labelled`: False for the bytes alone (no labels or phases), all a search needs; the
    moments of operators that write in place are then counted as if they did not, which
    leaves the peak the same (explorer.inplace).
    `constants`: `backward_constants` of these graphs, where the caller keeps them."""
    workspace = workspace or [{}] * len(graphs)
    handoffs = handoffs or [Handoff()] * len(graphs)
    moments = moments or [EagerPeaks()] * len(graphs)
    in_place = labelled and len(graphs) == 1  # as the runtime writes (explorer.inplace)
    lines, programs, in_flight = _graph_timelines(
        graphs, schedules, workspace, handoffs, moments, layout_copies, memo, in_place
    )
    eager = [h.eager for h in handoffs]
    if (
        len(lines) == 1
        and lines[0].static_bytes == static_bytes
        and eager[0] == EagerCode()
        and not unreached_grads(moments, -1)
    ):
        return lines[0]
    out = Timeline([], [], [], static_bytes)
    held = 0
    for k, line in enumerate(lines):
        held += eager[k].saved + eager[k].outputs
        held -= sum(earlier.released.get(k, 0) for earlier in lines[:k])  # frames let go
        first = 0
        if line.labels[:1] == [BEFORE_FORWARD]:  # measured from the step's start: held nothing
            _append(out, line, k, range(1), static_bytes, labelled)
            first = 1
        span = range(first, line.forward_end)
        base = static_bytes + held + eager[k].locals + in_flight[k]
        _append(out, line, k, span, base, labelled)
        held += line.held_bytes
    out.held_bytes = held
    # a later graph's outputs the user holds, and their tangents, stay alive through the
    # earlier backwards (the tangents autograd handed over are gone by then)
    users = [line.user_bytes for line in lines]
    if constants is None:
        constants = backward_constants(graphs, handoffs, moments)
    # the model's forward has returned
    held -= sum(line.frame_bytes - sum(line.released.values()) for line in lines)
    for k in reversed(range(len(lines))):
        held -= lines[k].held_bytes - lines[k].frame_bytes
        around = constants[k] + sum(users[k + 1 :])
        around += _kept_by_eager(k, eager, programs, graphs, handoffs)
        backward = range(lines[k].forward_end, len(lines[k].steps))
        _append(out, lines[k], k, backward, static_bytes + held + around, labelled)
        held -= eager[k].saved
    return out


def backward_constants(
    graphs: list[Graph], handoffs: list[Handoff], moments: list[EagerPeaks]
) -> list[int]:
    """For each run, the bytes that the step holds through its backward, beyond the static
    bytes, whatever the graphs' schedules: the later runs' parameter gradients; the user's
    tangents of the earlier runs (drawn before any backward); the user's own tangents for
    outputs a later graph reads too, from their maker's backward through every earlier one
    (CTRL's logits, read by its loss graph); what eager code holds through every backward or
    until this one; and gradients the autograd graph does not show, made by then."""
    pairs = list(zip(graphs, handoffs, strict=True))
    grads = [param_grad_bytes(g, h) + h.eager.grads for g, h in pairs]
    tangents = [_user_tangent_bytes(g, h) for g, h in pairs]
    own = [_own_user_tangent_bytes(g, h) for g, h in pairs]
    backward_all = sum(h.eager.backward for h in handoffs)
    return [
        sum(grads[k + 1 :])
        + sum(tangents[:k])
        + sum(own[k:])
        + handoffs[k].eager.waiting
        + backward_all
        + unreached_grads(moments, k)
        for k in range(len(graphs))
    ]


def _graph_timelines(
    graphs: list[Graph],
    schedules: list[GraphSchedule],
    workspace: list[dict[str, int]],
    handoffs: list[Handoff],
    moments: list[EagerPeaks],
    layout_copies: bool,
    memo: dict | None = None,
    in_place: bool = False,
) -> tuple[list[Timeline], list[StepProgram], list[int]]:
    """Each graph's own simulation, a handed-over tensor counted by one graph only, each
    graph's program, and the bytes handed over past each graph's forward: a tensor that its
    maker lets go of when its forward ends and a graph further on reads first, alive (held by
    the frames) through the graphs in between, which neither counts (I-BERT's embeddings' sum,
    read two graphs on)."""
    lines: list[Timeline] = []
    programs = []
    in_flight = [0] * len(graphs)
    read: set[tuple[int, ValueRef]] = set()  # handed-over tensors an earlier graph reads
    saved: set[tuple[int, ValueRef]] = set()  # ... and saves for its backward
    programs_saves: list[set[int]] = []  # each graph's transient inputs its backward reads
    for k, (graph, schedule) in enumerate(zip(graphs, schedules, strict=True)):
        key = (k, tuple(schedule.saved), tuple(schedule.backward), in_place)
        program = _memoized(memo, key, partial(_program, graph, schedule, handoffs[k], in_place))
        programs.append(program)
        saves = set(program.transient_slots) - set(program.frame_held)
        programs_saves.append(saves)
        # an input that an earlier graph keeps for its own backward (which runs after this
        # graph's) is alive all through this graph: that graph counts it; so is one an earlier
        # reader holds through the forward, unless this graph alone saves it (as is one eager
        # code made and an earlier graph read, which that graph counts through its backward
        # too where it saves it)
        held = frozenset(
            name
            for name, j, ref in handoffs[k].sources
            if programs[j].slot_of.get(ref) in lines[j].kept_passed_on
            or (j, ref) in saved
            or ((j, ref) in read and program.slot_of[(name, 0)] not in saves)
        ) | frozenset(
            name
            for name, j, first in handoffs[k].read_earlier
            if program.slot_of[(name, 0)] not in saves
            or programs[j].slot_of[(first, 0)] in programs_saves[j]
        )
        for name, j, ref in handoffs[k].sources:
            kept = programs[j].slot_of.get(ref) in lines[j].kept_passed_on
            if (j, ref) not in read and not kept:
                for between in range(j + 1, k):
                    in_flight[between] += graph.node(name).outputs[0].nbytes
            read.add((j, ref))
            if program.slot_of[(name, 0)] in saves:
                saved.add((j, ref))
        lines.append(
            _memoized(
                memo,
                (*key, held),
                partial(simulate, graph, program, workspace[k], held, moments[k], layout_copies),
            )
        )
    return lines, programs, in_flight


def _program(
    graph: Graph, schedule: GraphSchedule, handoff: Handoff, in_place: bool
) -> StepProgram:
    """The program of one of the step's graph runs, writing in place where the runtime
    does (`in_place`: in a step of one graph run once, explorer.inplace)."""
    program = compile_program(graph, schedule, handoff)
    return mark_in_place(graph, program) if in_place else program


def _memoized(memo: dict | None, key: tuple, make: Callable[[], T]) -> T:
    """`make()`, kept in `memo` under `key` (made afresh without a memo); a memo past
    MEMO_SIZE entries starts again."""
    if memo is None:
        return make()
    if key not in memo:
        if len(memo) >= MEMO_SIZE:
            memo.clear()
        memo[key] = make()
    return memo[key]


def _append(
    out: Timeline, line: Timeline, k: int, span: range, base: int, labelled: bool = True
) -> None:
    """Run `k`'s entries `span` on top of `base` bytes, and their labels and phases unless
    not `labelled` (a search asks only whether a step fits)."""
    shift = base - line.static_bytes
    out.steps.extend(shift + line.steps[i] for i in span)
    if labelled:
        out.labels.extend(f"g{k + 1}:{line.labels[i]}" for i in span)
        out.phase.extend(line.phase[i] for i in span)


def _kept_by_eager(
    run: int,
    eager: list[EagerCode],
    programs: list[StepProgram],
    graphs: list[Graph],
    handoffs: list[Handoff],
) -> int:
    """Bytes of the graphs' own tensors that eager code before `run` or an earlier run saves
    (EagerCode.kept), alive through `run`'s backward: from the forward's return to that
    code's backward, less where a graph from the one that first has it to that code keeps
    it for its own backward, which runs after that code's (it is counted there), whichever
    view of it that backward reads (a graph saves the detached alias of its output): its
    maker, or a later graph it was handed to (SEW's feature projection, which its position
    convolution's graph saves and eager code adds to the convolution's output)."""
    total = 0
    for before, code in enumerate(eager[: run + 1]):
        for first, ref, nbytes in code.kept:
            names = {first: ref} | {
                j: (name, 0)
                for j in range(first + 1, before)
                for name, maker, made in handoffs[j].sources
                if (maker, made) == (first, ref)
            }
            saved = any(_backward_reads(graphs[j], programs[j], name) for j, name in names.items())
            if not saved or run < first:
                total += nbytes
    return total


def _backward_reads(graph: Graph, program: StepProgram, ref: ValueRef) -> bool:
    """Whether the graph's backward reads `ref`'s storage, through any view of it."""
    views = storage_slots(graph, program.slot_of, [ref])
    return any(views & set(instr.in_slots) for instr in program.backward)


def unreached_grads(moments: list[EagerPeaks], run: int) -> int:
    """Bytes of gradients for parameters the step's autograd graph does not reach, alive
    during `run`'s backward (-1: by the step's end): made by code after the last forward,
    or after a later run's backward (measured: explorer.eagerpeaks)."""
    after_forward = sum(m.grads_after_forward for m in moments)
    return after_forward + sum(m.grads_after_backward for m in moments[run + 1 :])


def eager_throughout(eager: EagerCode) -> int:
    """A single graph's step: what eager code leaves for the whole step, counted at every
    operator (what only its backward holds too: the safe side)."""
    kept = sum(nbytes for _, _, nbytes in eager.kept)
    return eager.saved + kept + eager.outputs + eager.backward + eager.waiting + eager.locals


def _user_tangent_bytes(graph: Graph, handoff: Handoff) -> int:
    """Bytes of a graph's tangents that the user holds (drawn before any backward runs)."""
    tangents = graph.placeholders(ROLE_TANGENT)
    return sum(
        n.out_bytes
        for n in tangents
        if n.name not in handoff.handed_tangents or n.name in handoff.user_tangents_too
    )


def _own_user_tangent_bytes(graph: Graph, handoff: Handoff) -> int:
    """Bytes of the user's tangents for a graph's outputs that a later graph reads too: the
    graph's backward gets autograd's sum instead, while the user still holds these."""
    tangents = graph.placeholders(ROLE_TANGENT)
    return sum(n.out_bytes for n in tangents if n.name in handoff.user_tangents_too)


def output_storage_bytes(graph: Graph) -> int:
    """Bytes of the storages of a graph's outputs (an output that is a view lets go of its
    base's storage)."""
    owner = storage_owners(graph)
    roots = {owner.get(ref, ref) for ref in graph.model_outputs if ref is not None}
    return sum(graph.meta(root).nbytes for root in roots)


def param_grad_bytes(graph: Graph, handoff: Handoff) -> int:
    """Bytes of the gradients a graph's backward leaves for its parameters (one that a later
    graph reads too has its gradient counted there)."""
    params = {n.name for n in graph.placeholders("param")} - handoff.params_read_later
    total = 0
    for name, grad in zip(graph.primal_names(), graph.input_grads, strict=False):
        if grad is not None and name in params:
            total += graph.grad_bytes(grad)
    return total
