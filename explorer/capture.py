"""Capture a model's training step as the graphs the runtime will run.

The planner captures through the same `torch.compile` backend the runtime uses
(explorer.backend), so what is profiled, solved, simulated and executed is one IR from end to
end: Dynamo's graphs, each turned by AOTAutograd into a joint forward+backward FX graph. The
model's forward runs once, for real, under `torch.compile` (so Dynamo sees real inputs and
Python values); its BatchNorm statistics and the RNG state are put back afterwards, so planning
never changes the model. It runs after one eager forward, whose result is dropped: a model's
first call may differ from every later one. Most models give one graph; code Dynamo cannot
trace splits the model into several (a graph break), each planned. A graph break inside a
loop over layers makes Dynamo run one graph for every pass: each run is a graph of the step
(`CapturedGraph`, in the order they ran), all runs of one graph under one schedule. What the
model's own code between the graphs leaves to the step is read too: from the autograd graph
behind the outputs (explorer.eager) and from the Python frames at each run's start
(explorer.frames). The forward draws from seed 0, as verify's step does, so that a branch on a
random draw (LayerDrop) is planned on the path verify takes, whatever the caller's state.

The example inputs follow `torch.export`: positional `args` (a tensor or a tuple) and keyword
`kwargs`. The step planned is the model's forward and its backward from the gradients of every
output that requires grad, or, given a loss, from the loss of the outputs: the loss runs as
eager code after the graphs (what it holds for a moment is measured when profiling), the
outputs stay the user's (a loop that names them holds them), and their gradients come from
autograd, each let go once its graph's backward has read it.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx, nn

from explorer.backend import RematBackend, compile_call, dynamo_settings
from explorer.eager import (
    eager_code,
    parameters_outside_graphs,
    saved_by_eager_code,
    unreached_parameters,
)
from explorer.eagerpeaks import BACKWARD, END, FORWARD, START
from explorer.errors import RematWarning, UserError, first_line
from explorer.frames import Held, held_by_frames
from explorer.fxgraph import BATCH_NORM, is_tangent
from explorer.graph import (
    PLACEHOLDER,
    ROLE_CONSTANT,
    ROLE_INPUT,
    ROLE_PARAM,
    ROLE_TANGENT,
    Graph,
    ValueRef,
)
from explorer.modelstate import (
    STEP_SEED,
    drew_alike,
    generator_states,
    kept,
    output_tensors,
    step_inputs_and_state,
    storage_address,
    tensors_in,
)
from explorer.program import Handoff, baseline_schedule
from explorer.schedule import GraphSchedule
from explorer.symsizes import Sizes
from explorer.unread import leave_out_unread, unread_gradient_bytes, unread_tangents
from explorer.verify import loss_of

# the PyTorch running here keeps a graph's handed-over tangents through its backward
# (AOTAutograd before 2.13; see `Handoff`)
HANDED_TANGENTS_KEPT = torch.torch_version.TorchVersion(torch.__version__) < "2.13"


@dataclass
class CapturedGraph:
    """One run of a joint graph in the step: its FX form, its IR, and real values for its
    inputs. A graph the step runs several times (Dynamo reuses one graph for every pass of a
    loop it split) gives one of these per run, sharing the joint graph and its IR."""

    joint: fx.GraphModule
    graph: Graph
    num_fwd_outputs: int
    primals: list[torch.Tensor]  # what this run read for each graph input (for profiling)
    outputs: list = field(default_factory=list)  # what its forward returned, during capture
    handoff: Handoff = field(default_factory=Handoff)
    # the earlier run of the step of this same compiled graph, whose schedule this run follows
    # (the runtime has one schedule per compiled graph); None for a graph's first run
    same_graph_as: int | None = None
    # what the model's frames held as this run started (explorer.frames), during capture
    frames: list[Held] = field(default_factory=list, repr=False)
    # the compiled step that captured it (every graph of the step, without recomputation):
    # what the profile times as the runtime's own step (explorer.stepcost), compiled once
    runtime: Callable[..., Any] | None = field(default=None, repr=False)
    # that step's backend, which counts its runs as a plan's does and calls a marker at
    # each graph run's forward and backward start and end (explorer.eagerpeaks)
    backend: Recorder | None = field(default=None, repr=False)
    # the model's parameters that the step's autograd graph does not reach: their gradients,
    # if any, come from code no graph or eager node shows (explorer.eager.unreached_parameters)
    unreached: list = field(default_factory=list, repr=False)
    # the names of the parameters eager code uses and no graph reads: layers no plan reaches
    # (explorer.eager.parameters_outside_graphs)
    outside: list[str] = field(default_factory=list)
    # of the whole step: the bytes of the gradients, of zeros, that its graphs still make
    # from outputs the backward leaves unread, where eager PyTorch makes none: those a plan
    # cannot leave out (explorer.unread)
    unread_gradient_bytes: int = 0

    def state_tensors(self) -> list[torch.Tensor]:
        """The graph's parameters, buffers and constants (not activations or user inputs)."""
        roles = [n.role for n in _primal_nodes(self)]
        state = [t for t, role in zip(self.primals, roles, strict=True) if role != ROLE_INPUT]
        constants = self.joint.graph.find_nodes(op="get_attr")
        return state + [getattr(self.joint, node.target) for node in constants]


class Recorder(RematBackend):
    """The runtime's backend, recording each joint graph and every run of its forward (with
    the values it read and returned), running it without recomputation."""

    def __init__(self) -> None:
        super().__init__([])
        self.compiled: list[tuple[fx.GraphModule, Graph, int]] = []
        self.passes: list[CapturedGraph] = []  # one per forward run, in the order they ran
        self._first_pass: dict[int, int] = {}  # compiled graph number -> its first pass
        self.numbers: list[int] = []  # the compiled graph number of each pass
        self.done = False  # the capture is over: later runs (timing) record nothing
        # called with (forward|backward, start|end) around every run of a planned graph once
        # the capture is over (explorer.eagerpeaks)
        self.marker: Callable[[str, str], None] | None = None
        # Dynamo's graphs, in the order it compiled them, with fake inputs of their sizes:
        # what `timed_runtime` partitions again without tracing the model again
        self.dynamo_graphs: list[tuple[fx.GraphModule, list]] = []
        # while set, the graphs' calls run these instead (one per Dynamo graph, in order)
        self.alternates: list[Callable[..., Any]] | None = None

    def __call__(self, gm: fx.GraphModule, example_inputs: list) -> Any:
        compiled = super().__call__(gm, example_inputs)
        if self.done:  # compiled anew after the capture: runs as compiled
            return compiled
        index = len(self.dynamo_graphs)
        self.dynamo_graphs.append((gm, _fake_inputs(example_inputs)))

        def run(*args: Any) -> Any:
            alternates = self.alternates
            return (compiled if alternates is None else alternates[index])(*args)

        return run

    def _compile_forward(self, gm: fx.GraphModule, example_inputs: Any) -> Any:
        """The forward, recording each run's inputs and outputs (for `_handoffs`)."""
        number = self._planned
        run = super()._compile_forward(gm, example_inputs)
        if number is None:  # a graph without gradients
            return run
        if self.done:  # compiled for timing (timed_runtime)
            return self._marking(FORWARD, run)
        joint, graph, num_fwd_outputs = self.compiled[number - 1]

        def recording(args: list) -> Any:
            if self.done:
                return self._marked(FORWARD, run, args)
            primals = list(args)  # the boxed call clears `args`
            frames = held_by_frames(capture.__code__)
            result = run(args)
            same = self._first_pass.setdefault(number, len(self.passes))
            self.numbers.append(number)
            self.passes.append(
                CapturedGraph(
                    joint,
                    graph,
                    num_fwd_outputs,
                    primals,
                    list(result)[:num_fwd_outputs],
                    same_graph_as=None if same == len(self.passes) else same,
                    frames=frames,
                )
            )
            return result

        recording._boxed_call = True  # type: ignore[attr-defined]
        return recording

    def set_marker(self, marker: Callable[[str, str], None] | None) -> None:
        self.marker = marker

    def _backward_run(self, run: Callable[[list], Any]) -> Callable[[list], Any]:
        """Marked inside the check of its tangents, which is code outside the graph's
        operators: its `any()` of a tangent autograd filled with zeros holds a byte for a
        moment there, at the stretch's highest point (a side branch's 4,096 unread logits:
        the plan's peak was 1 byte over the prediction)."""
        return self._marking(BACKWARD, run)

    def _marking(self, kind: str, run: Callable[[list], Any]) -> Callable[[list], Any]:
        """`run` (boxed), marked at its start and end once a marker is set."""

        def marking(args: list) -> Any:
            return self._marked(kind, run, args)

        marking._boxed_call = True  # type: ignore[attr-defined]
        return marking

    def _marked(self, kind: str, run: Callable[[list], Any], args: list) -> Any:
        marker = self.marker
        if marker is None:
            return run(args)
        marker(kind, START)
        result = run(args)
        marker(kind, END)
        return result

    def _writes_in_place(self) -> bool:
        """While capturing, as a plan of one graph runs (the step is timed so when it is
        one graph run once: timed_runtime); afterwards as the schedules given say."""
        return not self.done or super()._writes_in_place()

    def _schedule_for(
        self, joint: fx.GraphModule, graph: Graph, num_fwd_outputs: int, _sizes: Sizes
    ) -> GraphSchedule:
        if not self.done:
            self.compiled.append((joint, graph, num_fwd_outputs))
        return baseline_schedule(graph)


def capture(
    model: nn.Module,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    autocast: torch.dtype | None = None,
    loss: Callable[[Any], torch.Tensor] | None = None,
) -> list[CapturedGraph]:
    """The joint graphs of one training step of `model(*args, **kwargs)` (see module docstring).

    `autocast`: capture under `torch.autocast` with this dtype (bf16/fp16), as the runtime will
    run under it. `loss`: the step backpropagates `loss(result)` rather than a gradient for
    each output. Raises UserError when nothing in the step needs a gradient, when Dynamo or
    AOTAutograd cannot capture the model (the message names the failing construct), or when
    the loss fails or is not a scalar with a gradient.
    """
    with kept(model, (args, kwargs), STEP_SEED), _autocast(args, autocast):
        _first_call(model, args, kwargs or {})
        eager_draws = generator_states(model, (args, kwargs))
    recorder = Recorder()
    call = compile_call(recorder)
    with kept(model, (args, kwargs), STEP_SEED), dynamo_settings(), _autocast(args, autocast):
        try:
            result = call(model, *args, **(kwargs or {}))
        except UserError:
            raise
        except Exception as exc:  # Dynamo or AOTAutograd could not capture the model
            raise UserError(f"cannot capture the model: {first_line(exc)}") from exc
        _warn_of_other_draws(eager_draws, generator_states(model, (args, kwargs)))
        losses = [] if loss is None else [loss_of(result, loss)]
    # the cache entry (the recorder) must not hold the step's tensors
    captured, recorder.passes, recorder.compiled = recorder.passes, [], []
    recorder.done = True
    if not captured:
        raise UserError(
            "nothing to plan: no graph of this step needs a gradient (no parameter or input "
            "requires grad, or torch.compile runs this model's code eagerly, as it does from an "
            "nn.LSTM or nn.GRU attribute to the end of the forward that uses it; "
            f"{RESUMABLE_RNN})"
        )
    _refuse_checkpointed_batch_norm(captured)
    _refuse_sparse_tensors(captured)
    known = step_inputs_and_state(model, (args, kwargs))
    outputs = output_tensors(result, lambda: known)
    watched = [number not in recorder.unwatched for number in recorder.numbers]
    unread, shared = unread_tangents(captured, [*outputs, *losses], losses or outputs, watched)
    leave_out_unread(captured, shared)
    _handoffs(captured, known, [*outputs, *losses], losses)
    _attach_eager_code(captured, [*outputs, *losses], known)
    unreached = unreached_parameters(model, [*outputs, *losses])
    state = [t for graph in captured for t in graph.state_tensors()]
    outside = parameters_outside_graphs(model, state, unreached)
    _warn_of_parameters_outside_graphs(outside, model)
    unread_bytes = unread_gradient_bytes(captured, unread)
    for graph in captured:
        graph.outputs, graph.frames = [], []  # only their identities were needed
        graph.runtime, graph.backend = call, recorder
        graph.unreached, graph.outside = unreached, outside
        graph.unread_gradient_bytes = unread_bytes
    return captured


def timed_runtime(captured: list[CapturedGraph]) -> tuple[Any, Recorder]:
    """The compiled step the profile times without recomputation, and its backend (whose
    marks time the graphs inside it): the capture's own, or one compiled anew where a plan's
    runs differ from it. They do where the step's graphs leave out gradients of outputs the
    loss leaves unread (explorer.unread): the capture's step computes them (GoogLeNet b2 64
    px with a loss on its logits: its two auxiliary heads' backward, of zeros), and timed so
    made the runtime's own cost read 1.27x the unmodified step where the plan's runs cost
    1.12x. They do where the step has several graph runs: the capture's operators write in
    place (explorer.inplace) as a plan of one graph run once does, and such a plan's do
    not. Only AOTAutograd's part is made anew, from Dynamo's graphs the capture kept: the
    step runs the capture's own compiled code, its guards and the code between its graphs,
    with each graph's call turned to its new twin (a second Dynamo trace took 5.5 s of a
    2-layer GPT-2's 8.6 s profile; partitioning its two graphs again, 0.5 s)."""
    first = captured[0]
    assert first.runtime is not None and first.backend is not None
    if len(captured) == 1 and not first.graph.unread_tangents:
        return first.runtime, first.backend
    recorder = Recorder()
    recorder.done = True  # records nothing; marks its graphs' runs
    recorder.schedules = [
        replace(baseline_schedule(run.graph), unread_tangents=list(run.graph.unread_tangents))
        for run in captured
    ]
    capturing = first.backend
    with dynamo_settings():
        alternates = [recorder(gm, inputs) for gm, inputs in capturing.dynamo_graphs]
    runtime = first.runtime

    def timed(*args: Any, **kwargs: Any) -> Any:
        capturing.alternates = alternates
        try:
            return runtime(*args, **kwargs)
        finally:
            capturing.alternates = None

    return timed, recorder


def _fake_inputs(example_inputs: list) -> list:
    """Dynamo's fake tensors for a graph's inputs (its tracing context's, of the same sizes),
    which hold no memory: a graph partitioned again later reads their sizes alone."""
    fake_mode = torch._guards.detect_fake_mode(example_inputs)
    assert fake_mode is not None
    return [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]


def _refuse_checkpointed_batch_norm(captured: list[CapturedGraph]) -> None:
    """Refuse a model that checkpoints its own BatchNorm layers (torch.utils.checkpoint, which
    Dynamo records on the joint graph's nodes as meta["recompute"]). Eager PyTorch runs such a
    layer again in the backward and updates its running statistics a second time (measured on
    torchvision's DenseNet with memory_efficient=True: statistics up to 0.14 apart after one
    step); a planned step updates them once, so it would train differently."""
    for graph in captured:
        for node in graph.joint.graph.nodes:
            if str(node.target) == BATCH_NORM and "recompute" in node.meta:
                raise UserError(
                    "cannot plan this step: the model checkpoints its own BatchNorm layers "
                    "(torch.utils.checkpoint; torchvision's DenseNet with memory_efficient=True), "
                    "which in eager PyTorch updates their running statistics twice a step, and a "
                    "planned step once: turn that checkpointing off (remat-explorer chooses what "
                    "to recompute)"
                )


def _refuse_sparse_tensors(captured: list[CapturedGraph]) -> None:
    """Refuse a step whose graphs make sparse tensors (the gradient of an
    nn.Embedding(sparse=True)): their bytes are not a strided span, and the plan and its
    memory accounting count dense tensors only (such a step failed while profiling, with
    PyTorch's own error)."""
    for graph in captured:
        for node in graph.joint.graph.nodes:
            values = node.meta.get("val")
            for value in values if isinstance(values, (tuple, list)) else [values]:
                if isinstance(value, torch.Tensor) and value.layout != torch.strided:
                    raise UserError(
                        f"cannot plan this step: it makes a {value.layout} tensor "
                        f"({node.target}; an nn.Embedding(sparse=True)'s gradient is one), and "
                        "remat-explorer plans dense tensors only: use sparse=False"
                    )


# measured on torch 2.14: Dynamo meets `self.lstm` as an attribute it cannot wrap, which it
# cannot resume after; a call of a module that holds the layer is a break it resumes after
RESUMABLE_RNN = (
    "such a layer called from a module of its own breaks the graph where Dynamo resumes, "
    "and the rest of the forward is compiled and planned"
)


def outside_graphs_note(outside: list[str], model: nn.Module) -> str:
    """One line on the layers no plan reaches (`outside`: their parameters' names), or ""."""
    if not outside:
        return ""
    total = sum(1 for p in model.parameters() if p.requires_grad)
    names = ", ".join(outside[:3]) + (", ..." if len(outside) > 3 else "")
    return (
        f"{len(outside)} of the model's {total} trainable parameters ({names}) are used by code "
        "that torch.compile runs eagerly, outside its graphs: no plan reaches it, and what it "
        "saves for the backward is kept whole (the predicted peaks count it). Dynamo runs "
        "eagerly an nn.LSTM or nn.GRU, a frame with a graph break inside a loop, and a forward "
        f"from an nn.LSTM or nn.GRU attribute to its end; {RESUMABLE_RNN}"
    )


def _warn_of_parameters_outside_graphs(outside: list[str], model: nn.Module) -> None:
    if outside:
        warnings.warn(
            f"remat-explorer: {outside_graphs_note(outside, model)}", RematWarning, stacklevel=3
        )


def _warn_of_other_draws(eager: list[torch.Tensor], compiled: list[torch.Tensor]) -> None:
    """Warn where the compiled forward, from the seed the eager one started from, leaves the
    generators in other states: torch.compile drew other random numbers. It leaves out a
    random operator whose result nothing uses (transformers' CANINE drops out its character
    encoder's output, which its classifier never reads; every later dropout then draws
    another mask), and a forward that reseeds from the system's entropy (Reformer's
    `torch.seed()`) draws otherwise each time. Under any plan, as under plain
    `torch.compile`, the step's dropout masks are then not the unmodified model's."""
    if drew_alike(eager, compiled):
        return
    warnings.warn(
        "remat-explorer: under torch.compile this model's forward draws other random numbers "
        "than it does eagerly (a random operator whose result nothing uses is left out, such "
        "as a dropout of an output the model does not return, or the forward reseeds the "
        "generator): trained under a plan, as under torch.compile itself, its dropout masks "
        "differ from the unmodified model's, so verify finds outputs and gradients not equal; "
        "remove the unused random operator (or its dropout) to train with the same masks",
        RematWarning,
        stacklevel=3,
    )


def _first_call(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """Run the forward once, eagerly, and drop its result, so that what a model does on its
    first call only is not what is planned: transformers installs its output-capturing hooks
    then, behind a lock Dynamo cannot trace (segformer's first step was two graphs, every
    later one a single graph the plan had not seen).

    On the meta device (a step planned, not run) eager code that reads a tensor's value
    fails, while Dynamo's trace of the same code may not read it (transformers skips its
    mask checks when told it is being traced): there a failed first call is passed over,
    and a forward that cannot run at all fails in the capture that follows."""
    try:
        model(*args, **kwargs)
    except Exception as exc:
        if all(t.device.type == "meta" for t in tensors_in((args, kwargs))):
            return
        raise UserError(f"the model's forward raised {first_line(exc)}") from exc


def _handoffs(
    captured: list[CapturedGraph],
    known: list[torch.Tensor],
    results: list[torch.Tensor],
    losses: list[torch.Tensor],
) -> None:
    """Which inputs of each graph were made during the step (by an earlier graph, or by eager
    code: neither the user's nor the model's, `known`), which outputs only later graphs read,
    and which nobody holds (read by eager code only); a single graph's too (its input made by
    eager code, its output that an eagerly computed loss reads). `losses`: the step
    backpropagates these, so every output's gradient comes from autograd, none from the
    user; but a loss that a graph returns (a transformers model given labels) gets its
    gradient, ones, from `backward()`, whose frame holds it to the backward's end, as a
    user's tangent is held (taken as autograd's, it was freed at its last use: 4 bytes under
    at every point of BERT with labels)."""
    from_loss = bool(losses)
    roots = {storage_address(t) for t in losses}
    user = {storage_address(t) for t in known} | {storage_address(t) for t in results}
    saved = saved_by_eager_code(results)
    held_at = [{held.address for held in graph.frames} for graph in captured]
    first_read: dict[int, tuple[int, str]] = {}  # storage: the first run to read it, its name
    last_read: dict[int, int] = {}  # storage: the last run to read it
    for j, graph in enumerate(captured):
        for node, value in zip(_primal_nodes(graph), graph.primals, strict=True):
            first_read.setdefault(storage_address(value), (j, node.name))
            last_read[storage_address(value)] = j
    made: dict[int, tuple[int, ValueRef]] = {}  # storage: the latest earlier run to output it
    for k, graph in enumerate(captured):
        primal_nodes = _primal_nodes(graph)
        transient = frozenset(
            node.name
            for node, value in zip(primal_nodes, graph.primals, strict=True)
            if node.role == ROLE_INPUT and storage_address(value) not in user
        )
        later = {storage for storage, j in last_read.items() if j > k}
        outputs = _tensor_outputs(graph)
        dropped = [(r, storage) for r, storage in outputs if storage not in user | later]
        only_later = later - user
        passed_on = frozenset(ref for ref, storage in outputs if storage in only_later)
        by_eager = [  # transient inputs eager code made
            (node.name, value)
            for node, value in zip(primal_nodes, graph.primals, strict=True)
            if node.name in transient and storage_address(value) not in made
        ]
        read_earlier = tuple(
            (name, *first_read[storage_address(value)])
            for name, value in by_eager
            if first_read[storage_address(value)][0] < k
        )
        # a transient input, eager code's or an earlier graph's, is counted by the first
        # graph to read it (unless its maker keeps it): as for a dropped output, the frames
        # may let go of it before the step's forward ends, once no later graph reads it
        # (not a leaf that asks for its gradient: autograd holds that one)
        first_here = [
            ((node.name, 0), storage_address(value))
            for node, value in zip(primal_nodes, graph.primals, strict=True)
            if node.name in transient
            and first_read[storage_address(value)][0] == k
            and not (value.is_leaf and value.requires_grad)
        ]
        sources = tuple(
            (node.name, *made[storage_address(value)])
            for node, value in zip(primal_nodes, graph.primals, strict=True)
            if node.name in transient and storage_address(value) in made
        )
        # autograd makes these tangents: a later graph's gradient for an output only later
        # graphs read, zeros for one nobody holds, the sum of the user's tangent and a later
        # graph's gradient for one both hold
        by_autograd = {
            ref
            for ref, storage in outputs
            if storage not in roots and (from_loss or storage not in user or storage in later)
        }
        summed = set() if from_loss else {r for r, s in outputs if s in user and s in later}
        graph.handoff = Handoff(
            transient,
            passed_on,
            sources,
            _handed_tangents(graph, by_autograd),
            HANDED_TANGENTS_KEPT,
            _handed_tangents(graph, summed),
            frozenset(
                node.name
                for node, value in zip(primal_nodes, graph.primals, strict=True)
                if node.role == ROLE_PARAM and storage_address(value) in later
            ),
            dropped=frozenset(ref for ref, _ in dropped),
            released=(
                *_released(dropped, held_at, k, saved),
                *_released(first_here, held_at, k, saved, last_read),
            ),
            read_earlier=read_earlier,
        )
        made.update({storage: (k, ref) for ref, storage in outputs})


def _attach_eager_code(
    captured: list[CapturedGraph], outputs: list[torch.Tensor], known: list[torch.Tensor]
) -> None:
    """Each run's Handoff gets what the model's eager code around it leaves to the step
    (explorer.eager), and the tensors of its that eager code before it keeps past its
    backward (`Handoff.kept_by_eager`)."""
    runs = [_values(graph) for graph in captured]
    returned = {storage for graph in captured for _, storage in _tensor_outputs(graph)}
    frames = [graph.frames for graph in captured]
    codes = eager_code(runs, returned, outputs, known, frames)
    for graph, eager in zip(captured, codes, strict=True):
        graph.handoff = replace(graph.handoff, eager=eager)
    for before, eager in enumerate(codes):
        for first, ref, _ in eager.kept:
            if first >= before:
                handoff = captured[first].handoff
                by_eager = handoff.kept_by_eager | {ref}
                captured[first].handoff = replace(handoff, kept_by_eager=by_eager)


def _released(
    dropped: list[tuple[ValueRef, int]],
    held_at: list[set[int]],
    run: int,
    saved: set[int],
    last_read: dict[int, int] | None = None,
) -> list[tuple[ValueRef, int]]:
    """Of `run`'s outputs that neither the user nor a later graph holds (or its inputs that
    eager code made, `last_read`: the last run to read each), those that no frame held as a
    later run (after the last to read it) started (`held_at`: the storages they held), each
    with the first such run; not those eager code saved (autograd keeps them)."""
    found = []
    last_read = last_read or {}
    for ref, storage in dropped:
        later = range(max(run, last_read.get(storage, run)) + 1, len(held_at))
        first = next((k for k in later if storage not in held_at[k]), None)
        if first is not None and storage not in saved:
            found.append((ref, first))
    return found


def _values(captured: CapturedGraph) -> list[tuple[ValueRef, torch.Tensor]]:
    """What a run read and returned, by its name in the graph."""
    primals = [(n.name, 0) for n in _primal_nodes(captured)]
    outputs = zip(captured.graph.model_outputs, captured.outputs, strict=False)
    return [
        *zip(primals, captured.primals, strict=True),
        *((ref, t) for ref, t in outputs if ref is not None and isinstance(t, torch.Tensor)),
    ]


def _primal_nodes(captured: CapturedGraph) -> list:
    """The graph's inputs but tangents and constants, in the order a run reads them."""
    return [
        n
        for n in captured.graph.nodes
        if n.phase == PLACEHOLDER and n.role not in (ROLE_TANGENT, ROLE_CONSTANT)
    ]


def _tensor_outputs(captured: CapturedGraph) -> list[tuple[ValueRef, int]]:
    """Each tensor output of the graph and the storage of what its forward returned."""
    return [
        (ref, storage_address(value))
        for ref, value in zip(captured.graph.model_outputs, captured.outputs, strict=False)
        if ref is not None and isinstance(value, torch.Tensor)
    ]


def _handed_tangents(captured: CapturedGraph, outputs: set[ValueRef]) -> frozenset[str]:
    """The tangent placeholders of the graph's outputs in `outputs`, matched through the
    descriptions AOTAutograd (torch 2.9 on) writes on the joint graph's inputs and outputs
    (`meta["desc"]`); a tangent without one is taken as the user's (held: the safe side)."""
    joint = captured.joint.graph
    model_outputs = captured.graph.model_outputs
    descs = joint.output_node().meta.get("desc") or []
    at = {desc: k for k, desc in enumerate(descs[: len(model_outputs)]) if desc is not None}
    return frozenset(
        node.name
        for node in joint.find_nodes(op="placeholder")
        if is_tangent(node)
        and (k := at.get(getattr(node.meta.get("desc"), "output", None))) is not None
        and model_outputs[k] in outputs
    )


@contextlib.contextmanager
def _autocast(args: tuple, dtype: torch.dtype | None) -> Iterator[None]:
    if dtype is None:
        yield
        return
    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), "cpu")
    with torch.autocast(device_type=device, dtype=dtype):
        yield
