"""The runtime: a `torch.compile` backend that trains a model under a rematerialization plan.

This is the module an exported schedule imports; it needs only torch (and the plain-Python IR
modules next to it), never PuLP, numpy or torchvision.

`wrap_with_schedule(model, made_for, schedule)` returns a `RematModule`. Its forward, when
gradients are enabled, calls `torch.compile(model, backend=RematBackend(...), dynamic=False)`.
Dynamo captures the model's graphs and guards them; AOTAutograd builds each graph's joint
forward+backward graph and hands it to our partition function, which applies the plan
(explorer.partition). So everything PyTorch guards is guarded here too: a new input shape,
dtype or stride, an input that requires grad, a layer frozen or unfrozen, BatchNorm switched
to eval, autocast, hooks, a Python flag read by the forward: each triggers a new capture, and
the new graph gets a plan:

- a graph the plan was made for (same fingerprint): its schedule, exactly;
- the same structure at other sizes (a smaller last batch, another sequence length): the same
  schedule, its memory simulated for the new sizes; a warning, once, if that exceeds the budget;
- anything else (another structure: frozen layers, eval BatchNorm, autocast, an input that
  needs a gradient): the plan's saved set carried over by node name, every other value
  recomputed just before its first use (explorer.program.schedule_from_saved), simulated, and a
  warning, once, if that exceeds the budget. Always correct; the budget is what may suffer.

A plan counts how many times the step runs each graph (Dynamo reuses one graph for every pass
of a loop it split the model inside; every run follows the graph's one schedule): a forward that
runs a graph more often (a path other than the one planned) trains exactly and warns, once;
so does a call that starts while the activations an earlier call saved wait for their backward
(the model called twice before one backward, as a siamese network is).

Contract, for users of the wrapped module:
- it is called like the model (positional and keyword inputs, any output structure) and
  gradients land in the original parameters' `.grad` (and inputs' `.grad`); the wrapped module
  owns the original model as `.model`, so optimizers, `state_dict` and DistributedDataParallel
  see the same parameters;
- BatchNorm running statistics are updated once per forward: buffer updates run in the
  forward only, never in a recomputation;
- dropout draws the same masks as the unmodified model from the same seed: random operators
  run once, in the forward; a CPU dropout mask the schedule recomputes is drawn again from the
  generator state saved before its draw, and the generator is put back (explorer.rngreplay);
- with gradients disabled the model runs unchanged (no capture at all);
- a second backward with `retain_graph=True` works, and so do input gradients with
  `create_graph=True`; differentiating those again (double backward, as a WGAN-GP gradient
  penalty does) is refused by AOTAutograd with its own error, as for any compiled module: run
  that forward on the unwrapped `wrapped.model`;
- it pickles (the compiled state is rebuilt on load) and deep-copies;
- the step that compiles peaks as later ones do: Dynamo's tracing leaves reference cycles that
  hold tensors of the model's forward (the output object a frame it traced received), which
  Python frees only when its cycle collector next runs, so the wrapped forward collects them as
  each of its compilations ends and as it returns (about 0.25 s each, in a step that compiles).
"""

from __future__ import annotations

import contextlib
import gc
import types
import warnings
import weakref
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch._dynamo.backends.common import aot_autograd

from explorer.errors import RematWarning
from explorer.fxgraph import describe
from explorer.graph import FORWARD, Graph, ValueRef
from explorer.modelstate import storage_address
from explorer.partition import partition
from explorer.program import (
    baseline_schedule,
    check_program,
    compile_program,
    schedule_from_saved,
)
from explorer.rewrite import compact_dropout, fuse_kept_dropouts
from explorer.schedule import GraphSchedule, Schedule
from explorer.simulate import simulate
from explorer.units import format_bytes

EXACT, RESIZED, MAPPED = "exact", "same structure, other sizes", "carried over"


class RematError(RuntimeError):
    """A schedule that cannot be used with this model: the message says why and what to do."""


@dataclass
class GraphPlan:
    """What the backend did with one captured graph."""

    fingerprint: str
    how: str  # EXACT, RESIZED or MAPPED
    predicted_peak_bytes: int
    budget_bytes: int | None
    recomputed: int

    @property
    def over_budget(self) -> bool:
        return self.budget_bytes is not None and self.predicted_peak_bytes > self.budget_bytes


def _boxed(gm: fx.GraphModule, _example_inputs: Any):
    """Run the FX graph's own generated code with the boxed calling convention: it takes the
    argument list and clears it, so no input outlives its last use (explorer.partition)."""
    _no_donated_buffers()
    gm.graph.set_codegen(torch.fx.graph._BoxedCodeGen())
    gm.recompile()
    forward = gm.forward

    def run(args: list) -> Any:
        return forward(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _no_donated_buffers() -> None:
    """Record, in the graph being compiled, that its backward donates no buffer.

    We compile with donated buffers off (see `dynamo_settings`), which leaves AOTAutograd's
    record of them unset; its runtime check, which reads the global setting, then refuses a
    later `retain_graph=True` or `create_graph=True` backward. An empty record says what is
    true: nothing was donated."""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    if metadata is not None and metadata.bw_donated_idxs is None:
        metadata.bw_donated_idxs = []


class RematBackend:
    """A torch.compile backend: AOTAutograd with a partition function that applies a plan.

    `choose(graph)` decides each graph's schedule; the default carries `schedules` over as the
    module docstring says. `plans` records what happened to each graph, in compile order.
    """

    def __init__(self, schedules: list[GraphSchedule], budget_bytes: int | None = None) -> None:
        self.schedules = schedules
        self.budget_bytes = budget_bytes
        self.plans: list[GraphPlan] = []
        self._warned: set[str] = set()
        # forward runs of each planned graph, by its number in compile order, since the
        # caller last cleared them, and how many runs a step of the plan makes of each
        self.runs: Counter[int] = Counter()
        self.counted_runs: dict[int, int] = {}
        # what the planned graphs' forward runs saved for their backward (weak references:
        # alive until the backward has run or the autograd graph is let go), and how many of
        # each planned graph's forward outputs come before its saved values
        self._saved: list[weakref.ref] = []
        self._forward_outputs: dict[int, int] = {}
        self._partitioned = 0  # graphs planned so far
        self._planned: int | None = None  # the graph just planned, until its forward compiles
        self._compile = aot_autograd(
            fw_compiler=self._compile_forward,
            bw_compiler=self._compile_backward,
            partition_fn=self._partition,
            keep_inference_input_mutations=True,
        )

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Any:
        return self._compile(gm, example_inputs)

    def _compile_forward(self, gm: fx.GraphModule, example_inputs: Any) -> Any:
        """The forward, counting its runs when it is a planned graph's (not an inference
        graph's, which has no plan)."""
        run = _boxed(gm, example_inputs)
        number, self._planned = self._planned, None
        if number is None:
            return run

        outputs = self._forward_outputs[number]

        def counted(args: list) -> Any:
            self.runs[number] += 1
            # storages only: the run frees each input at its last use (`_boxed`)
            given = {storage_address(a) for a in args if _dense(a)}
            result = run(args)
            self._note_saved(result, outputs, given)
            return result

        counted._boxed_call = True  # type: ignore[attr-defined]
        return counted

    def _compile_backward(self, gm: fx.GraphModule, example_inputs: Any) -> Any:
        return _boxed(gm, example_inputs)

    def _note_saved(self, result: Any, outputs: int, given: set[int]) -> None:
        """Keep weak references to the activations a forward run saved: its saved values but
        those in the storage of a graph input (`given`: their addresses), such as a
        parameter, which outlive the autograd graph anyway. (A saved value that is also an
        output reaches the user as another tensor object, which does not keep it alive.)"""
        self._saved = [r for r in self._saved if r() is not None]
        self._saved += [
            weakref.ref(t)
            for t in result[outputs:]
            if _dense(t) and storage_address(t) not in given
        ]

    def held_for_backward(self) -> int:
        """The bytes that forward runs saved and that no backward has freed yet (each storage
        once): activations of an earlier call whose autograd graph is still alive."""
        alive = [t for t in (r() for r in self._saved) if t is not None]
        return sum({storage_address(t): t.untyped_storage().nbytes() for t in alive}.values())

    def runs_beyond_plan(self) -> tuple[int, int] | None:
        """A planned graph's forward runs since `runs` was cleared, and the runs the plan
        counts of it, for the first graph that ran more often than counted; else None.

        Dynamo reuses one graph for every pass of a loop, or every call of a layer, that it
        split the model inside (a graph break there, for instance at a data-dependent branch
        such as LayerDrop's); each pass keeps its own activations, which a plan made for
        fewer passes does not count."""
        for number, runs in self.runs.items():
            counted = self.counted_runs.get(number, 1)
            if runs > counted:
                return runs, counted
        return None

    def _partition(
        self,
        joint: fx.GraphModule,
        _joint_inputs: Any,
        *,
        num_fwd_outputs: int,
        static_lifetime_input_indices: list[int] | None = None,
        **_: Any,
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        compact_dropout(joint)
        graph = describe(joint.graph, num_fwd_outputs, static_lifetime_input_indices)
        schedule = self._schedule_for(joint, graph, num_fwd_outputs)
        self._partitioned += 1
        self._planned = self._partitioned
        self.counted_runs[self._planned] = _runs_planned(self.schedules, graph)
        self._forward_outputs[self._planned] = num_fwd_outputs
        forward, backward = partition(joint, graph, schedule, num_fwd_outputs)
        fuse_kept_dropouts(forward)  # as compile_program predicts it
        return forward, backward

    def _schedule_for(
        self, _joint: fx.GraphModule, graph: Graph, _num_fwd_outputs: int
    ) -> GraphSchedule:
        return self.choose(graph)

    def choose(self, graph: Graph) -> GraphSchedule:
        """The schedule for a newly captured graph (see the module docstring)."""
        fingerprint, structure = graph.fingerprint(), graph.structure()
        exact = next((s for s in self.schedules if s.fingerprint == fingerprint), None)
        if exact is not None:
            _check_fits(graph, exact)
            return self._record(graph, exact, EXACT, exact.budget_bytes)
        same = next((s for s in self.schedules if s.structure == structure), None)
        if same is not None:
            _check_fits(graph, same)
            schedule = GraphSchedule(
                fingerprint,
                list(same.saved),
                list(same.backward),
                recomputed=list(same.recomputed),
                structure=structure,
            )
            return self._record(graph, schedule, RESIZED, same.budget_bytes)
        source = _closest(self.schedules, graph)
        if source is None:
            return self._record(graph, baseline_schedule(graph), MAPPED, None)
        keep = _carried_saved(source, graph)
        return self._record(graph, schedule_from_saved(graph, keep), MAPPED, source.budget_bytes)

    def _record(
        self, graph: Graph, schedule: GraphSchedule, how: str, budget: int | None
    ) -> GraphSchedule:
        peak = simulate(graph, compile_program(graph, schedule)).peak_bytes
        plan = GraphPlan(graph.fingerprint(), how, peak, budget, len(schedule.recomputed))
        self.plans.append(plan)
        if plan.over_budget and how != EXACT and graph.structure() not in self._warned:
            self._warned.add(graph.structure())
            need, budget_text = _sizes(peak, budget)
            warnings.warn(
                f"remat-explorer: a graph captured again ({how}) needs {need} under the "
                f"carried-over plan, more than its budget {budget_text}; plan this shape "
                "or setting to get a schedule made for it",
                RematWarning,
                stacklevel=2,
            )
        return schedule


def _dense(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.layout == torch.strided


def _runs_planned(schedules: list[GraphSchedule], graph: Graph) -> int:
    """How many runs of `graph` a step of the plan makes: its schedules made for this graph,
    else (a resized graph) those made for its structure; at least one."""
    fingerprint, structure = graph.fingerprint(), graph.structure()
    exact = sum(s.fingerprint == fingerprint for s in schedules)
    return max(1, exact or sum(s.structure == structure for s in schedules))


def _check_fits(graph: Graph, schedule: GraphSchedule) -> None:
    """Refuse a schedule that does not run on the graph it claims (a hand-edited file)."""
    names = {n.name: n for n in graph.nodes}
    unknown = [n for n in schedule.backward if n not in names]
    unknown += [r[0] for r in schedule.saved if r[0] not in names]
    if unknown:
        raise RematError(f"the schedule names operators this graph does not have: {unknown[:3]}")
    bad = [r for r in schedule.saved if r[1] >= len(names[r[0]].outputs) or r[1] < 0]
    if bad:
        raise RematError(f"the schedule saves outputs that do not exist: {bad[:3]}")
    pinned = [n for n in schedule.backward if names[n].phase == FORWARD and names[n].pinned]
    if pinned:
        raise RematError(
            f"the schedule recomputes {pinned[0]}, which must run once (a random draw, or it "
            "reads an input the forward overwrites): recomputing it would change the result"
        )
    problem = check_program(graph, compile_program(graph, schedule))
    if problem is not None:
        raise RematError(f"the schedule does not run on this graph: {problem}")


def _mib(n: int | None) -> str:
    return "none" if n is None else f"{n / 2**20:.1f} MiB"


def _sizes(need: int, budget: int | None) -> tuple[str, str]:
    """`need` and `budget` for a message saying one exceeds the other: in MiB, or in bytes
    where the MiB read the same ("needs 0.1 MiB, more than its budget 0.1 MiB")."""
    if _mib(need) == _mib(budget):
        return f"{need} bytes", f"{budget} bytes"
    return _mib(need), _mib(budget)


def _closest(schedules: list[GraphSchedule], graph: Graph) -> GraphSchedule | None:
    """The schedule whose saved values name the most forward nodes of `graph`."""
    names = {n.name for n in graph.nodes if n.phase == FORWARD}
    scored = [(sum(r[0] in names for r in s.saved), k) for k, s in enumerate(schedules)]
    best = max(scored, default=(0, -1))
    return schedules[best[1]] if best[0] > 0 else None


def _carried_saved(source: GraphSchedule, graph: Graph) -> set[ValueRef]:
    """The source's saved values that exist in `graph` as forward values of the same op."""
    kept: set[ValueRef] = set()
    forward = {n.name: n for n in graph.nodes if n.phase == FORWARD}
    for name, index in source.saved:
        node = forward.get(name)
        if node is not None and index < len(node.outputs) and node.outputs[index] is not None:
            kept.add((name, index))
    return kept


def _call(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return model(*args, **kwargs)


def compile_call(backend: Any) -> Any:
    """`torch.compile` of `model(*args, **kwargs)` with `backend`, on a code object of its own.

    Dynamo keeps its compiled entries (and counts them against its cache limit) per code
    object. Compiling the module itself would put every wrapped model of the process on
    nn.Module's one `__call__` code; a fresh copy of `_call`'s code per backend gives each
    wrapped model its own cache, freed with it."""
    code = _call.__code__.replace(co_name=f"remat_call_{id(backend):x}")
    function = types.FunctionType(code, _call.__globals__, code.co_name)
    return torch.compile(function, backend=backend, dynamic=False)


@contextlib.contextmanager
def dynamo_settings() -> Iterator[None]:
    """Dynamo settings under which a plan is honoured, for the duration of one call.

    Hooks registered after the first call must trigger a new capture (Dynamo skips those
    guards by default, and the hook would silently never fire). Each wrapped model and each
    input shape adds a compiled entry for the model's forward code; past the cache limit Dynamo
    would quietly run the model eagerly, ignoring the plan, so the limit is raised and reaching
    it is an error instead. Donated buffers would forbid a second backward with
    `retain_graph=True`. Dynamo skips the guards on a parameter (its `requires_grad` among
    them) while its module's parameter dict is unchanged; in PyTorch 2.11
    (pytorch/pytorch#139476) a layer unfrozen after the first step then kept the graph
    captured while it was frozen and silently got no gradient, so those guards are kept.
    Dynamo would trace NumPy's random functions as torch's, drawing other numbers than the
    unmodified model (HuBERT's SpecAugment masks) and moving torch's generator under its
    dropouts: they run eagerly instead, from NumPy's own generator."""
    with (
        torch._dynamo.config.patch(
            skip_nnmodule_hook_guards=False,
            skip_tensor_guards_with_matching_dict_tags=False,
            recompile_limit=64,
            accumulated_recompile_limit=4096,
            fail_on_recompile_limit_hit=True,
            use_numpy_random_stream=True,
        ),
        torch._functorch.config.patch(donated_buffer=False),
    ):
        yield


@contextlib.contextmanager
def collecting_compile_garbage() -> Iterator[None]:
    """Run Python's cycle collector as each compilation inside the block ends.

    Dynamo's variable trackers keep the real values a traced frame received in reference
    cycles, garbage once Dynamo has returned from that compilation: a tensor among them stays
    alive until the collector next runs, in the middle of some later step or never before the
    backward. Collecting as each compilation ends frees what the one before left, and as the
    block ends what the last one left. Measured: BERT with gradient checkpointing kept its
    last hidden state and pooled output through the first step's backward (4,352 bytes, 2.2%
    over the plan), T5 a dropout's mask (2,048 bytes); later steps, which compile nothing,
    were to the byte."""
    compiled = False

    def collect(_args: object) -> None:
        nonlocal compiled
        compiled = True
        gc.collect()

    torch._dynamo.callback_handler.register_end_callback(collect)
    try:
        yield
    finally:
        torch._dynamo.callback_handler.remove_end_callback(collect)
        if compiled:
            gc.collect()


class RematModule(nn.Module):
    """The user's model, trained under a rematerialization plan (see the module docstring)."""

    def __init__(self, model: nn.Module, made_for: dict, schedule: dict) -> None:
        super().__init__()
        self.model = model
        self.made_for = made_for
        self.schedule = schedule
        self._compile()

    def _compile(self) -> None:
        plan = Schedule.from_dict(self.schedule)
        backend = RematBackend(plan.graphs, plan.budget_bytes)
        # plain attributes, outside nn.Module's registry of submodules and state
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "_compiled", compile_call(backend))
        object.__setattr__(self, "_warned_runs", False)
        object.__setattr__(self, "_warned_grads", bool(self.made_for.get("gradients_held")))
        object.__setattr__(self, "_warned_held", False)

    @property
    def plans(self) -> list[GraphPlan]:
        """What was done with each graph captured so far (see `RematBackend`)."""
        return self.backend.plans

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return self.model(*args, **kwargs)
        self.backend.runs.clear()
        if not self._warned_grads:
            self._warn_of_held_gradients()
        if not self._warned_held:
            self._warn_of_held_activations()
        with dynamo_settings(), collecting_compile_garbage():
            result = self._compiled(self.model, *args, **kwargs)
        beyond = self.backend.runs_beyond_plan()
        if beyond is not None and not self._warned_runs:
            object.__setattr__(self, "_warned_runs", True)
            warnings.warn(
                f"remat-explorer: this step ran one of its graphs {beyond[0]} times, where the "
                f"plan counts {beyond[1]} (Dynamo reuses a graph for each pass of a loop it "
                "split the model inside, for instance at a random branch such as LayerDrop's): "
                "the peak may exceed the budget",
                RematWarning,
                stacklevel=2,
            )
        return result

    def _warn_of_held_activations(self) -> None:
        """Once: this call starts while activations an earlier call saved wait for their
        backward (the model called twice before one backward, as a siamese network, a
        contrastive loss or a GAN's discriminator on real and fake images is), which a plan
        made for one call per step does not count."""
        held = self.backend.held_for_backward()
        if not held:
            return
        object.__setattr__(self, "_warned_held", True)
        warnings.warn(
            f"remat-explorer: this call starts while the activations an earlier call saved "
            f"({format_bytes(held)}) are still held by its autograd graph (the model called "
            "twice before one backward, or a graph kept with retain_graph=True), which the "
            "plan, made for one call per step, does not count: the peak may exceed the budget "
            "by that much; plan a module whose forward makes every call of the step, or run "
            "each call's backward before the next call",
            RematWarning,
            stacklevel=2,
        )

    def _warn_of_held_gradients(self) -> None:
        """Once: the step starts with gradients an earlier one left, which a plan made for a
        step from none (the default) does not count."""
        held = [p.grad for p in self.model.parameters() if p.grad is not None]
        if not held:
            return
        object.__setattr__(self, "_warned_grads", True)
        nbytes = sum(g.untyped_storage().nbytes() for g in held)
        warnings.warn(
            f"remat-explorer: this step starts with the gradients of an earlier one "
            f"({format_bytes(nbytes)}: gradient accumulation, or zero_grad(set_to_none=False)), "
            "which the plan does not count: the peak may exceed the budget by that much; "
            "plan with gradients_held=True (--gradients-held), or set them to None before "
            "each step (optimizer.zero_grad())",
            RematWarning,
            stacklevel=2,
        )

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.pop("backend", None)
        state.pop("_compiled", None)
        state.pop("_warned_runs", None)
        state.pop("_warned_grads", None)
        state.pop("_warned_held", None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._compile()


def wrap_with_schedule(model: nn.Module, made_for: dict, schedule: dict) -> RematModule:
    """Wrap `model` so that its training steps follow `schedule` (see the module docstring).

    Refuses, with a RematError that says why, a model whose parameters are not the ones the
    schedule was made for. A model in torch.compile's wrapper, or already wrapped, has the
    module inside it wrapped (`module_inside`)."""
    model = module_inside(model)
    expected = made_for.get("parameters")
    if expected is not None:
        found = parameter_signature(model)
        if found != expected:
            raise RematError(_mismatch(made_for, expected, found))
    try:
        Schedule.from_dict(schedule)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise RematError(f"corrupt schedule ({type(exc).__name__}: {exc})") from exc
    return RematModule(model, made_for, schedule)


def module_inside(model: nn.Module) -> nn.Module:
    """The module a plan is for, with a warning where it is not `model` itself: the one inside
    torch.compile's wrapper (an OptimizedModule, whose parameters are named `_orig_mod.*`, so
    that neither its plan nor its file fitted the module itself, and whose inductor kernels
    were verify's reference), or inside a RematModule. A plan runs the model under
    torch.compile with this backend, which runs AOTAutograd's graphs operator by operator, as
    eager PyTorch does: the wrapper given is set aside, its kernels with it."""
    wrappers = (
        (torch._dynamo.eval_frame.OptimizedModule, "_orig_mod", "torch.compile's wrapper"),
        (RematModule, "model", "a RematModule (wrapped with a schedule already)"),
    )
    for kind, inner_name, what in wrappers:
        inner = getattr(model, inner_name, None)
        if isinstance(model, kind) and isinstance(inner, nn.Module):
            warnings.warn(
                f"remat-explorer: the model given is in {what}; the module inside it "
                f"(.{inner_name}) is the one planned, wrapped and verified: a plan runs it "
                "under torch.compile with remat-explorer's backend, operator by operator as "
                "eager PyTorch, not under the wrapper given",
                RematWarning,
                stacklevel=3,
            )
            return module_inside(inner)
    return model


def parameter_signature(model: nn.Module) -> list[list]:
    """Each parameter's name, shape and dtype: what identifies the model a plan is for."""
    return [[n, list(p.shape), str(p.dtype)] for n, p in model.named_parameters()]


def _mismatch(made_for: dict, expected: list, found: list) -> str:
    name = made_for.get("model", {}).get("name", "another model")
    names = {tuple(e[:1]) for e in expected}
    missing = next((e[0] for e in expected if e not in found), None)
    extra = next((f[0] for f in found if (f[0],) not in names), None)
    detail = f"parameter {missing!r} differs or is missing" if missing else ""
    detail = detail or (f"it has parameter {extra!r}" if extra else "parameters differ")
    return (
        f"this schedule was made for {name} ({len(expected)} parameter tensors); this model "
        f"has {len(found)}: {detail}. Plan and export a schedule for this model"
    )
