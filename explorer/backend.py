"""The runtime: a `torch.compile` backend that trains a model under a rematerialization plan.

This is the module an exported schedule imports; it needs only torch (and the plain-Python IR
modules next to it), never PuLP, numpy or torchvision.

`wrap_with_schedule(model, made_for, schedule)` returns a `RematModule`. Its forward, when
gradients are enabled, calls the model under `torch.compile` with a `RematBackend`: Dynamo
captures the model's graphs and guards them; AOTAutograd builds each graph's joint
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

Inputs of the plan's sizes (`input_signature`, recorded in `made_for`) run under a compile at
fixed sizes, so they get the graphs the plan was made for. Other sizes run under a compile that
lets Dynamo mark a dimension dynamic once its size has changed ("automatic dynamic"): the first
other size is captured at its sizes, the next one once more for any size of that dimension
(explorer.symsizes), and that graph serves every later size, so that text batches padded to
their longest sequence cost two captures, not one per length up to Dynamo's recompile limit.
Such a graph takes the schedule of the graph at fixed sizes it matches: node by node where
their layouts agree (Graph.layout), else the backward order on the operators that align (for
any size Dynamo keeps slices that at one size vanish; explorer.carry). Its peak is simulated
again at each new size a run brings (GraphPlan.peaks_at) and checked against the budget, with
a warning, once.

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
- a parameter that no output the loss reads depends on keeps `.grad` None, as in eager
  (explorer.unreached), so optimizers skip it;
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
import threading
import types
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn
from torch._dynamo.backends.common import aot_autograd
from torch.utils._pytree import tree_flatten

from explorer.carry import (
    ALIGNED_SHARE,
    aligned_names,
    carried_saved,
    closest_schedule,
    in_aligned_order,
    renamed,
)
from explorer.errors import RematError, RematWarning
from explorer.fxgraph import describe_with_sizes
from explorer.graph import FORWARD, Graph
from explorer.inplace import mark_in_place, write_in_place
from explorer.modelstate import storage_address
from explorer.partition import partition
from explorer.program import (
    StepProgram,
    baseline_schedule,
    check_program,
    compile_program,
    schedule_from_saved,
)
from explorer.rewrite import compact_dropout, fuse_kept_dropouts
from explorer.schedule import GraphSchedule, Schedule
from explorer.simulate import simulate
from explorer.symsizes import SizedGraph, Sizes, binding_sources, sizes_in
from explorer.units import format_bytes
from explorer.unreached import leaving_unreached, tangent_outputs, watch_outputs
from explorer.unread import pruned_joint

EXACT, RESIZED, MAPPED = "exact", "same structure, other sizes", "carried over"
RECOMPILES = 64  # captures of one wrapped model before Dynamo's limit: a RematError
RECOMPILE_LIMIT = (
    "torch.compile has captured this model again {limit} times (Dynamo's recompile limit): every "
    "input size, dtype or setting its forward meets for the first time is captured again, "
    "and an input dimension whose size changes once is captured for any size, unless the "
    "forward's Python turns that size into a fixed choice; TORCH_LOGS=recompiles shows what "
    "made each capture. Bring the inputs to a few sizes (pad text batches to a multiple of "
    "a length), or keep what the forward reads fixed"
)


class RecompileLimitReached(RematError):
    """Dynamo captured the wrapped model again as often as its recompile limit allows."""


@dataclass
class GraphPlan:
    """What the backend did with one captured graph. A graph captured for any size of some
    input dimension (`symbolic`) predicts the peak of the sizes it was captured at; each
    other size is checked against the budget when a step first runs it."""

    fingerprint: str
    how: str  # EXACT, RESIZED or MAPPED
    predicted_peak_bytes: int
    budget_bytes: int | None
    recomputed: int
    symbolic: bool = False
    # a symbolic graph's predicted peak at each set of sizes its runs brought (the values of
    # its symbolic dimensions, in the order its inputs hold them)
    peaks_at: dict[tuple, int] = field(default_factory=dict)

    @property
    def over_budget(self) -> bool:
        return self.budget_bytes is not None and self.predicted_peak_bytes > self.budget_bytes


def _boxed(gm: fx.GraphModule, _example_inputs: Any):
    """Run the FX graph's own generated code with the boxed calling convention: it takes the
    argument list and clears it, so no input outlives its last use (explorer.partition). An
    input it never reads is let go before it runs, as explorer.simulate frees it: FX's code
    holds such an input to its end (a backward's tangent of an output the loss leaves
    unread, made of zeros by autograd: GoogLeNet's two auxiliary heads' at batch 2 were
    16,000 bytes above the plan)."""
    _no_donated_buffers()
    gm.graph.set_codegen(torch.fx.graph._BoxedCodeGen())
    gm.recompile()
    forward = gm.forward
    placeholders = gm.graph.find_nodes(op="placeholder")
    unread = [k for k, node in enumerate(placeholders) if not node.users]

    def run(args: list) -> Any:
        for k in unread:
            args[k] = None
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
        self._tangents: dict[int, dict[int, str]] = {}  # explorer.unreached.tangent_outputs
        # the graphs, by number, a run of which no pre-hook could watch (watch_outputs)
        self.unwatched: set[int] = set()
        # the bytes of the tensor constants the compiled graphs hold, by storage
        self._constants: dict[int, int] = {}
        self._partitioned = 0  # graphs planned so far
        self._planned: int | None = None  # the graph just planned, until its forward compiles
        # the graphs captured at fixed sizes, with their schedules: a graph captured later
        # for any size takes the schedule of one of them (`_source_for`)
        self._fixed: list[_Fixed] = []
        # the graphs captured for any size, by number in compile order
        self._symbolic: dict[int, _Symbolic] = {}
        self._compile = aot_autograd(
            fw_compiler=self._compile_forward,
            bw_compiler=self._compile_backward,
            partition_fn=self._partition,
            keep_inference_input_mutations=True,
        )

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Any:
        before = self._partitioned
        compiled = self._compile(gm, example_inputs)
        if self._partitioned == before:  # no training graph: nothing to watch
            return compiled
        number = self._partitioned
        tangents = self._tangents[number]

        def run(*args: Any) -> Any:
            outputs = compiled(*args)
            # what no used output reaches stays None
            if not watch_outputs(args, outputs, tangents):
                self.unwatched.add(number)
            return outputs

        return run

    def _compile_forward(self, gm: fx.GraphModule, example_inputs: Any) -> Any:
        """The forward, counting its runs when it is a planned graph's (not an inference
        graph's, which has no plan)."""
        run = _boxed(gm, example_inputs)
        self._note_constants(gm)
        number, self._planned = self._planned, None
        if number is None:
            return run

        outputs = self._forward_outputs[number]
        symbolic = self._symbolic.get(number)
        if symbolic is not None:
            symbolic.sources = binding_sources(gm.graph.find_nodes(op="placeholder"))

        def counted(args: list) -> Any:
            self.runs[number] += 1
            if symbolic is not None:
                self._check_sizes(symbolic, sizes_in(args, symbolic.sources))
            # storages only: the run frees each input at its last use (`_boxed`)
            given = {storage_address(a) for a in args if _dense(a)}
            result = run(args)
            self._note_saved(result, outputs, given)
            return result

        counted._boxed_call = True  # type: ignore[attr-defined]
        return counted

    def _compile_backward(self, gm: fx.GraphModule, example_inputs: Any) -> Any:
        self._note_constants(gm)
        return leaving_unreached(gm, self._backward_run(_boxed(gm, example_inputs)))

    def _backward_run(self, run: Callable[[list], Any]) -> Callable[[list], Any]:
        """A backward's boxed run, inside the check of its tangents (`leaving_unreached`):
        here as it is (explorer.capture's recorder marks it)."""
        return run

    def _note_constants(self, gm: fx.GraphModule) -> None:
        for node in gm.graph.find_nodes(op="get_attr"):
            value = getattr(gm, node.target)
            if _dense(value):
                self._constants[storage_address(value)] = value.untyped_storage().nbytes()

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

    def constant_bytes(self) -> int:
        """The bytes of the tensor constants the compiled graphs hold (a tensor the model's
        code makes from numbers, `torch.tensor(-100)`), alive as long as the compiled model:
        the plan counts them with the parameters (BART's one int64, 8 bytes)."""
        return sum(self._constants.values())

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
        graph, sizes = describe_with_sizes(
            joint.graph, num_fwd_outputs, static_lifetime_input_indices
        )
        joint, graph, sizes = self._as_planned(joint, graph, sizes, num_fwd_outputs)
        self._partitioned += 1
        number = self._planned = self._partitioned
        self.counted_runs[number] = _runs_planned(self.schedules, graph)
        self._forward_outputs[number] = num_fwd_outputs
        self._tangents[number] = tangent_outputs(joint, num_fwd_outputs)
        schedule = self._schedule_for(joint, graph, num_fwd_outputs, sizes)
        forward, backward = partition(joint, graph, schedule, num_fwd_outputs)
        fuse_kept_dropouts(forward)  # as compile_program predicts it
        if self._writes_in_place() and not sizes:
            program = mark_in_place(graph, compile_program(graph, schedule))
            write_in_place(forward, backward, program)
        return forward, backward

    def _writes_in_place(self) -> bool:
        """Whether operators may write in place (explorer.inplace): in a plan of one graph
        run once."""
        return len(self.schedules) == 1

    def _as_planned(
        self, joint: fx.GraphModule, graph: Graph, sizes: Sizes, num_fwd_outputs: int
    ) -> tuple[fx.GraphModule, Graph, Sizes]:
        """The joint graph, its description and sizes, without the gradients a schedule
        left out (explorer.unread) where one was made for it so: the pruned graph has that
        schedule's fingerprint or structure, or, captured again for any size (`sizes`), it
        takes the schedule of a graph pruned so (`_source_for`). Else as captured."""
        fingerprints = {s.fingerprint for s in self.schedules}
        left_out = {frozenset(s.unread_tangents) for s in self.schedules if s.unread_tangents}
        if not left_out or graph.fingerprint() in fingerprints:
            return joint, graph, sizes
        structures = {s.structure for s in self.schedules}
        for tangents in left_out:
            pruned = pruned_joint(joint, graph, num_fwd_outputs, tangents)
            if pruned is None or pruned[1].unread_tangents != sorted(tangents):
                continue
            described = pruned[1]
            if described.fingerprint() in fingerprints or described.structure() in structures:
                return pruned
            source = self._source_for(described) if sizes else None
            if source is not None and source[0].graph.unread_tangents == sorted(tangents):
                return pruned
        return joint, graph, sizes

    def _schedule_for(
        self, _joint: fx.GraphModule, graph: Graph, _num_fwd_outputs: int, sizes: Sizes
    ) -> GraphSchedule:
        return self.choose(graph, sizes)

    def choose(self, graph: Graph, sizes: Sizes | None = None) -> GraphSchedule:
        """The schedule for a newly captured graph (see the module docstring). `sizes`: those
        of a graph captured for any size of some dimension (explorer.symsizes), which takes
        the schedule of a graph captured at fixed sizes (`_source_for`)."""
        fingerprint, structure = graph.fingerprint(), graph.structure()
        exact = next((s for s in self.schedules if s.fingerprint == fingerprint), None)
        if exact is not None:
            _check_fits(graph, exact)
            return self._record(graph, exact, EXACT, exact.budget_bytes, sizes)
        source = self._source_for(graph) if sizes else None
        if source is not None:
            fixed, names, whole = source
            if whole:  # node by node: the same schedule
                schedule = renamed(fixed.schedule, graph, names)
                how = MAPPED if fixed.plan.how == MAPPED else RESIZED
            else:
                schedule, how = in_aligned_order(fixed.schedule, graph, names), MAPPED
            _check_fits(graph, schedule)
            return self._record(graph, schedule, how, fixed.plan.budget_bytes, sizes, fixed)
        same = next((s for s in self.schedules if s.structure == structure), None)
        if same is not None:
            _check_fits(graph, same)
            schedule = renamed(same, graph)
            return self._record(graph, schedule, RESIZED, same.budget_bytes, sizes)
        closest = closest_schedule(self.schedules, graph)
        if closest is None:
            return self._record(graph, baseline_schedule(graph), MAPPED, None, sizes)
        keep = carried_saved(closest, graph)
        schedule = schedule_from_saved(graph, keep)
        return self._record(graph, schedule, MAPPED, closest.budget_bytes, sizes)

    def _source_for(self, graph: Graph) -> tuple[_Fixed, dict[str, str], bool] | None:
        """For a graph captured for any size: the graph captured at fixed sizes whose schedule
        it takes, the names its nodes have in `graph`, and whether that is every node. The
        latest one of its layout (Graph.layout) maps node by node; else the one whose
        operators align best maps the nodes that align, if most do: captured for any size,
        Dynamo keeps slices that at one size select everything and vanish (GPT-2's)."""
        for fixed in reversed(self._fixed):
            if fixed.graph.layout() == graph.layout():
                pairs = zip(fixed.graph.nodes, graph.nodes, strict=True)
                return fixed, {a.name: b.name for a, b in pairs}, True
        aligned = [(aligned_names(fixed.graph, graph), fixed) for fixed in self._fixed]
        names, fixed = max(aligned, key=lambda pair: len(pair[0]), default=({}, None))
        if fixed is None or len(names) < ALIGNED_SHARE * len(graph.nodes):
            return None
        return fixed, names, False

    def _record(
        self,
        graph: Graph,
        schedule: GraphSchedule,
        how: str,
        budget: int | None,
        sizes: Sizes | None = None,
        source: _Fixed | None = None,
    ) -> GraphSchedule:
        """Note what the graph being planned got (`plans`), warn where its plan needs more
        than its budget, and keep what later graphs read: a graph at fixed sizes as a source
        for graphs captured for any size; such a graph (`sizes`) for the checks of its runs'
        sizes, counted as many runs a step as the plan's graphs of its source's structure,
        all of which it serves."""
        program = compile_program(graph, schedule)
        peak = simulate(graph, program).peak_bytes
        plan = GraphPlan(
            graph.fingerprint(), how, peak, budget, len(schedule.recomputed), bool(sizes)
        )
        self.plans.append(plan)
        number = self._partitioned
        if sizes:
            self._symbolic[number] = _Symbolic(graph, sizes, program, plan)
            if source is not None:
                structure = source.graph.structure()
                planned = sum(s.structure == structure for s in self.schedules)
                self.counted_runs[number] = planned or source.counted_runs
        else:
            self._fixed.append(_Fixed(graph, schedule, plan, self.counted_runs[number]))
        if plan.over_budget and how != EXACT:
            self._warn_over_budget(graph, f"a graph captured again ({how})", peak, budget)
        return schedule

    def _warn_over_budget(self, graph: Graph, what: str, peak: int, budget: int | None) -> None:
        """Once per graph structure: `what` (the graph) needs more than its budget."""
        need, budget_text = _sizes(peak, budget)
        self._warn_once(
            graph,
            f"{what} needs {need} under the carried-over plan, more than its budget "
            f"{budget_text}; plan this shape or setting to get a schedule made for it",
        )

    def _warn_once(self, graph: Graph, message: str) -> None:
        """A RematWarning about `graph`, the first for its structure only."""
        if graph.structure() in self._warned:
            return
        self._warned.add(graph.structure())
        warnings.warn(f"remat-explorer: {message}", RematWarning, stacklevel=4)

    def _check_sizes(self, symbolic: _Symbolic, sizes: tuple) -> None:
        """The first run of a graph captured for any size at sizes it has not run at: its
        peak there, simulated (GraphPlan.peaks_at), against its budget (warned about once)."""
        plan = symbolic.plan
        if sizes in plan.peaks_at or sizes in symbolic.unknown:
            return
        binding = {s: v for (s, _, _), v in zip(symbolic.sources, sizes, strict=True)}
        try:
            graph = symbolic.sized.at(binding)
        except ValueError as exc:  # a size its inputs do not give (none is known)
            symbolic.unknown.add(sizes)
            what = f"a graph captured for any size ({plan.how}), run at sizes {list(sizes)}"
            self._warn_once(
                symbolic.graph,
                f"the peak of {what} cannot be predicted ({exc}): it is not checked against "
                "the budget",
            )
            return
        peak = simulate(graph, symbolic.program).peak_bytes
        plan.peaks_at[sizes] = peak
        if plan.budget_bytes is not None and peak > plan.budget_bytes:
            what = f"a graph captured for any size ({plan.how}), run at sizes {list(sizes)},"
            self._warn_over_budget(symbolic.graph, what, peak, plan.budget_bytes)


@dataclass
class _Fixed:
    """A graph captured at fixed sizes, its schedule, what it got and its runs a step."""

    graph: Graph
    schedule: GraphSchedule
    plan: GraphPlan
    counted_runs: int


@dataclass
class _Symbolic:
    """A graph captured for any size of some dimension: its IR at the sizes it was captured
    at, its values' sizes as expressions, its schedule's program (the same at every size),
    what it got, and where its runs find each symbol (explorer.symsizes.binding_sources)."""

    graph: Graph
    sizes: Sizes
    program: StepProgram
    plan: GraphPlan
    sources: list = field(default_factory=list)
    unknown: set[tuple] = field(default_factory=set)  # sizes whose peak cannot be predicted
    sized: SizedGraph = field(init=False)  # the graph to evaluate at each size, built once

    def __post_init__(self) -> None:
        self.sized = SizedGraph(self.graph, self.sizes)


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


def _call(model: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return model(*args, **kwargs)


def compile_call(backend: Any, dynamic: bool | None = False) -> Any:
    """`torch.compile` of `model(*args, **kwargs)` with `backend`, on a code object of its own.

    Dynamo keeps its compiled entries (and counts them against its cache limit) per code
    object. Compiling the module itself would put every wrapped model of the process on
    nn.Module's one `__call__` code; a fresh copy of `_call`'s code per backend gives each
    wrapped model its own cache, freed with it. `dynamic`: torch.compile's (False: every
    capture at fixed sizes, as planning captures; None: a dimension whose size changes is
    captured again for any size, as training runs)."""
    suffix = "" if dynamic is False else "_any_size"
    code = _call.__code__.replace(co_name=f"remat_call_{id(backend):x}{suffix}")
    function = types.FunctionType(code, _call.__globals__, code.co_name)
    return torch.compile(function, backend=backend, dynamic=dynamic)


# per thread: the config patches of `dynamo_settings`, made once, and whether they are entered
_settings = threading.local()


def _settings_patches() -> tuple[Any, Any]:
    patches = getattr(_settings, "patches", None)
    if patches is None:
        patches = _settings.patches = (
            torch._dynamo.config.patch(
                skip_nnmodule_hook_guards=False,
                skip_tensor_guards_with_matching_dict_tags=False,
                recompile_limit=RECOMPILES,
                accumulated_recompile_limit=4096,
                fail_on_recompile_limit_hit=True,
                use_numpy_random_stream=True,
            ),
            torch._functorch.config.patch(donated_buffer=False),
        )
    return patches


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
    dropouts: they run eagerly instead, from NumPy's own generator.

    Every wrapped call pays for this block: the patches are made once per thread (making them
    at each call took 62 µs of a wrapped call on this project's CPU, entering them 32 µs),
    and a block inside another (a wrapped model called by another's forward) enters nothing,
    the settings being in effect already."""
    if getattr(_settings, "entered", False):
        yield
        return
    dynamo, functorch = _settings_patches()
    _settings.entered = True
    try:
        with dynamo, functorch:
            yield
    finally:
        _settings.entered = False


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

    @classmethod
    def over(
        cls, model: nn.Module, backend: RematBackend, compiled: Any, args: tuple, kwargs: dict
    ) -> RematModule:
        """`model` called as a wrapped model calls it, through `compiled` (a `compile_call`
        of `backend`) at the sizes of `args` and `kwargs`: the capture's step without
        recomputation, which the profile times (explorer.stepcost) with the work every
        wrapped call does around it, so that predicted overheads count that work too."""
        wrapped = cls.__new__(cls)
        nn.Module.__init__(wrapped)
        wrapped.model = model
        wrapped.made_for = {"input_signature": input_signature(args, kwargs)}
        wrapped.schedule = {}
        wrapped._run_with(backend, compiled, compiled)
        return wrapped

    def _compile(self) -> None:
        plan = Schedule.from_dict(self.schedule)
        backend = RematBackend(plan.graphs, plan.budget_bytes)
        # the inputs of the plan's sizes run the graphs the plan was made for; others run
        # graphs Dynamo captures again for any size of a dimension that changes (a text
        # batch padded to its longest sequence: one capture for every length, not one each)
        self._run_with(backend, compile_call(backend), compile_call(backend, dynamic=None))

    def _run_with(self, backend: RematBackend, compiled: Any, compiled_any_size: Any) -> None:
        # plain attributes, outside nn.Module's registry of submodules and state
        object.__setattr__(self, "backend", backend)
        object.__setattr__(self, "_compiled", compiled)
        object.__setattr__(self, "_compiled_any_size", compiled_any_size)
        object.__setattr__(self, "_planned_inputs", self.made_for.get("input_signature"))
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
        planned = self._planned_inputs is None or input_signature(args, kwargs) == (
            self._planned_inputs
        )
        call = self._compiled if planned else self._compiled_any_size
        with dynamo_settings(), collecting_compile_garbage():
            try:
                result = call(self.model, *args, **kwargs)
            except torch._dynamo.exc.FailOnRecompileLimitHit as exc:
                raise RecompileLimitReached(RECOMPILE_LIMIT.format(limit=RECOMPILES)) from exc
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
        state.pop("_compiled_any_size", None)
        state.pop("_planned_inputs", None)
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


def input_signature(args: tuple, kwargs: dict) -> list:
    """The shape and dtype of every tensor among a call's inputs (None for anything else), in
    pytree order: a call with the plan's signature runs the graphs the plan was made for."""
    leaves, _ = tree_flatten((args, kwargs))
    return [[list(x.shape), str(x.dtype)] if isinstance(x, torch.Tensor) else None for x in leaves]


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
