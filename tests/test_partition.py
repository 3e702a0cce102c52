"""The partition function: a schedule written into the forward and backward FX graphs, and the
memory those graphs hold when they run, byte for byte as `simulate` predicts."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from explorer.backend import wrap_with_schedule
from explorer.capture import capture
from explorer.graph import FORWARD
from explorer.memory import LiveBytesTracker, tensor_bytes
from explorer.partition import RECOMPUTE, partition
from explorer.program import baseline_schedule, compile_program, schedule_from_saved
from explorer.schedule import Schedule
from explorer.simulate import simulate
from explorer.verify import training_step


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8)
    ).train()


@pytest.fixture(scope="module")
def captured():
    model, x = _model(), torch.randn(64, 32)
    (graph,) = capture(model, (x,))
    return model, x, graph


def _measured_peak(model, x, graph, schedule) -> int:
    """Run `schedule` through the runtime in verify's step (the outputs and their gradients
    held by the caller, as the planner counts them); the whole-step peak."""
    plan = Schedule([schedule], budget_bytes=None)
    wrapped = wrap_with_schedule(copy.deepcopy(model), {}, plan.to_dict())
    training_step(wrapped, (x,), seed=0)  # capture and compile first
    wrapped.zero_grad(set_to_none=True)
    static = tensor_bytes([*model.parameters(), *model.buffers(), x])
    with LiveBytesTracker() as meter:
        training_step(wrapped, (x,), seed=0)
    return static + meter.peak_bytes


def test_recomputations_sit_right_before_their_first_reader(captured):
    _model_, _x, cap = captured
    graph = cap.graph
    schedule = schedule_from_saved(graph, set())  # recompute all that may be
    assert schedule.recomputed
    _fw, bw = partition(cap.joint, graph, schedule, cap.num_fwd_outputs)
    nodes = [n for n in bw.graph.nodes if n.op == "call_function"]
    recomputed = [k for k, n in enumerate(nodes) if n.meta.get("remat") == RECOMPUTE]
    assert recomputed
    for k in recomputed:  # each feeds something later, and nothing before it needed it
        users = [nodes.index(u) for u in nodes[k].users if u in nodes]
        assert users and min(users) > k
    # the backward runs in the schedule's order (copies are named anew: compare their sources)
    sources = [n.meta["remat_source"] for n in nodes if n.meta.get("remat_source")]
    assert sources == [n for n in schedule.backward if n in set(sources)]


def test_a_node_recomputed_twice_is_copied_twice(captured):
    model, x, cap = captured
    graph = cap.graph
    base = schedule_from_saved(graph, set())
    gelu = next(n for n in base.recomputed if graph.node(n).target == "aten.gelu.default")
    # recompute it once more right before the last backward operator that reads it
    readers = [
        k
        for k, name in enumerate(base.backward)
        if any(r[0] == gelu for r in graph.node(name).inputs)
    ]
    again = copy.copy(base)
    again.backward = base.backward[: readers[-1]] + [gelu] + base.backward[readers[-1] :]
    _fw, bw = partition(cap.joint, graph, again, cap.num_fwd_outputs)
    copies = [
        n
        for n in bw.graph.nodes
        if n.meta.get("remat") == RECOMPUTE and str(n.target) == "aten.gelu.default"
    ]
    assert len(copies) >= 2
    predicted = simulate(graph, compile_program(graph, again)).peak_bytes
    assert _measured_peak(model, x, graph, again) == predicted


def test_measured_peak_is_the_simulated_one(captured):
    """The accounting the solver optimizes is what the runtime holds, to the byte (breaks if
    simulate and the FX graphs disagree on any free: a saved value, a recomputation, the
    boxed inputs)."""
    model, x, cap = captured
    graph = cap.graph
    for schedule in (baseline_schedule(graph), schedule_from_saved(graph, set())):
        predicted = simulate(graph, compile_program(graph, schedule)).peak_bytes
        assert _measured_peak(model, x, graph, schedule) == predicted


def test_dead_recomputation_is_left_out_of_the_prediction_too(captured):
    """A recomputation whose result nobody reads: FX drops it from the backward graph, so the
    prediction must drop it as well (breaks if compile_program stops pruning)."""
    model, x, cap = captured
    graph = cap.graph
    base = baseline_schedule(graph)
    forward = [n.name for n in graph.nodes if n.phase == FORWARD]
    wasteful = copy.copy(base)
    wasteful.backward = base.backward + forward  # recompute the whole forward, for nothing
    program = compile_program(graph, wasteful)
    assert [i.node for i in program.backward] == [
        i.node for i in compile_program(graph, base).backward
    ]
    predicted = simulate(graph, program).peak_bytes
    assert _measured_peak(model, x, graph, wasteful) == predicted


def test_programs_of_one_graph_share_its_slot_tables_not_their_instructions(captured):
    # the slot tables are made once per graph (Graph.derived); catches: an instruction whose
    # slot lists are the shared table's own (a program that changed them, as the fusing of
    # dropouts or the frees do, would change the next program of that graph)
    _, _, cap = captured
    graph = cap.graph
    base = baseline_schedule(graph)
    first = compile_program(graph, base)
    for instr in [*first.forward, *first.backward]:
        instr.in_slots.append(-1)
        instr.out_slots.append(-1)
    again = compile_program(graph, base)
    assert again.slot_of is first.slot_of
    assert all(-1 not in i.in_slots + i.out_slots for i in [*again.forward, *again.backward])
    made = []
    assert graph.derived("test.once", lambda g: made.append(g) or len(made)) == 1
    assert graph.derived("test.once", lambda g: made.append(g) or len(made)) == 1
