"""Inputs whose sizes change from step to step: text batches padded to their longest sequence, a
dataloader's smaller last batch. Calls at the plan's sizes run the graphs the plan was made for;
at other sizes Dynamo captures the model once more for any size of the dimension that changed
(explorer.symsizes), and the schedule follows it there: training stays bitwise the unmodified
model's, and the peak at each size is predicted to the byte and checked against the budget."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import planner, train_step
from ir_graphs import StepBuilder

from explorer import backend
from explorer.backend import EXACT, RESIZED, RematError, RematModule, wrap_with_schedule
from explorer.carry import aligned_names, in_aligned_order
from explorer.errors import RematWarning
from explorer.graph import BACKWARD
from explorer.memory import LiveBytesTracker, tensor_bytes
from explorer.modelstate import held_state
from explorer.program import compile_program, schedule_from_order, schedule_from_saved
from explorer.schedule import Schedule
from explorer.simulate import simulate


def _wrapped(plan, point: int) -> RematModule:
    schedule = plan.sweep(points=3).points[point].schedule
    assert point or schedule.recomputed_ops(), "the lowest point should recompute something"
    return wrap_with_schedule(copy.deepcopy(plan.model), plan.made_for(), schedule.to_dict())


def test_a_batch_of_every_length_trains_exactly_with_one_capture_for_all(quick_search):
    # catches: each new length captured again (4 to 7 s each for this 4-layer GPT) until
    # Dynamo's recompile limit stopped training at the 64th length (FailOnRecompileLimitHit);
    # a graph for any length whose dropout masks, drawn again in the backward from the
    # generator state, were not eager's
    plan = planner("sample:gpt", 2, 64)
    wrapped = _wrapped(plan, 0)  # the lowest point: recomputes, masks drawn again
    reference = copy.deepcopy(plan.model)
    tokens = torch.randint(0, 256, (2, 136), generator=torch.Generator().manual_seed(1))
    lengths = [64, *range(136, 65, -1)]  # the plan's, then 71 others
    for model in (reference, wrapped):
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for step, length in enumerate(lengths):
            optimizer.zero_grad(set_to_none=True)
            train_step(model, (tokens[:, :length].clone(),), seed=step)
            optimizer.step()
    pairs = zip(reference.parameters(), wrapped.model.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    # the plan's graph, one at the first other length, one for any length
    assert [(p.how, p.symbolic) for p in wrapped.plans] == [
        (EXACT, False),
        (RESIZED, False),
        (RESIZED, True),
    ]
    assert sorted(wrapped.plans[-1].peaks_at) == [(n,) for n in range(66, 136)]


def test_the_peak_at_every_batch_size_is_predicted_to_the_byte(quick_search):
    # catches: a graph for any size checked at the sizes it was captured at only (a larger
    # batch ran over the budget without a word), or its sizes read wrong (the peak at 5
    # predicted as at 6)
    plan = planner("sample:tiny_cnn", 8, 32)
    wrapped = _wrapped(plan, 0)
    x = torch.randn(16, 3, 32, 32)
    batches = {n: x[:n].clone() for n in (3, 5, 6, 8, 12, 16)}  # each its own storage
    state = tensor_bytes(held_state(wrapped.model))
    peaks = {}
    for batch in (8, 6, 5, 3, 6, 8):
        train_step(wrapped, (batches[batch],), 0)  # the first call at a size may capture it
        wrapped.zero_grad(set_to_none=True)
        with LiveBytesTracker() as meter:
            train_step(wrapped, (batches[batch],), 0)
        wrapped.zero_grad(set_to_none=True)
        peaks[batch] = state + tensor_bytes([batches[batch]]) + meter.peak_bytes
    exact, fixed, any_size = wrapped.plans
    assert (exact.how, any_size.how, any_size.symbolic) == (EXACT, RESIZED, True)
    assert peaks[8] == exact.predicted_peak_bytes
    assert peaks[6] == fixed.predicted_peak_bytes  # the first other size: captured at it
    assert {b: peaks[b] for b in (5, 3)} == {b: any_size.peaks_at[(b,)] for b in (5, 3)}
    assert peaks[5] < peaks[6] and peaks[3] < peaks[5]
    with pytest.warns(RematWarning, match=r"any size .*run at sizes \[12\].*more than its budget"):
        train_step(wrapped, (batches[12],), 0)  # no capture: the graph for any size runs it
    wrapped.zero_grad(set_to_none=True)
    with LiveBytesTracker() as meter:
        train_step(wrapped, (batches[12],), 0)
    wrapped.zero_grad(set_to_none=True)
    assert state + tensor_bytes([batches[12]]) + meter.peak_bytes == any_size.peaks_at[(12,)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematWarning)  # said once
        train_step(wrapped, (batches[16],), 0)


def test_a_forward_that_fixes_its_size_in_python_is_refused_in_words_at_the_limit(monkeypatch):
    # catches: Dynamo's own "Hard failure due to fail_on_recompile_limit_hit" as the only
    # word when a forward turns the size into a Python value at every call (each length
    # captured again, never for any size); `KeyError: primals_2` describing a graph that
    # returns a symbolic size
    class Fixes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # the length as text: a fixed number in each capture, never any length (and a
            # symbolic size among a graph's outputs, which once failed the capture)
            return (x * self.weight).sum(1) * float(str(x.shape[1]))

    monkeypatch.setattr(backend, "RECOMPILES", 8)  # Dynamo's limit as the runtime sets it
    # the settings' patches, made once per thread, are made again with it (and put back after)
    monkeypatch.setattr(backend._settings, "patches", None, raising=False)
    # a plan of no graph, for inputs of no size: every call runs at another size
    wrapped = wrap_with_schedule(Fixes(), {"input_signature": []}, Schedule([]).to_dict())
    with pytest.raises(RematError, match="again 8 times .*recompile limit.*TORCH_LOGS=recompiles"):
        for length in range(2, 20):
            wrapped(torch.randn(3, length, 4)).sum().backward()


def _mask_read_twice(with_view: bool):
    """A mask read by the first and the last operator; `with_view` adds a view in between, as
    Dynamo's graph for any length keeps slices that at one length vanish."""
    b = StepBuilder()
    x, w = b.input("x", 400), b.param("w", 4)
    mask = b.op("mask", [x], 400)
    a = b.op("a", [x, mask, w], 4000)
    if with_view:
        a = b.view("s", a)
    return b.build(b.op("c", [b.op("b", [a], 400), mask, w], 400))[0]


def test_a_value_saved_for_one_reader_and_made_again_for_another_is_carried_so():
    # catches: a graph for any size taking only the saved values of the graph whose operators
    # align, each value recomputed once: a mask saved for the last layer's backward and made
    # again for the first's was kept throughout (GPT-2's causal mask: 34 operators, and the
    # carried schedule needed 311,072 bytes where its source's 298,496 fit the budget)
    source, graph = _mask_read_twice(False), _mask_read_twice(True)
    traced = [n.name for n in source.nodes if n.phase == BACKWARD]
    order = [*traced[:2], "mask", *traced[2:]]  # freed after grad_c, made again for grad_a
    schedule = schedule_from_order(source, order)
    assert ("mask", 0) in schedule.saved and schedule.recomputed == ["mask"]
    names = aligned_names(source, graph)
    assert set(names) == {n.name for n in source.nodes}  # all but the view and its gradient
    carried = in_aligned_order(schedule, graph, names)
    assert carried.backward == ["grad_c", "grad_b", "grad_s", "mask", "grad_a", *traced[3:]]
    assert ("mask", 0) in carried.saved and carried.recomputed == ["mask"]
    peak = simulate(source, compile_program(source, schedule)).peak_bytes
    assert simulate(graph, compile_program(graph, carried)).peak_bytes == peak == 9608
    by_saved = schedule_from_saved(graph, {(names[n], k) for n, k in schedule.saved})
    assert simulate(graph, compile_program(graph, by_saved)).peak_bytes == peak + 400
