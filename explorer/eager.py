"""What the model's eager code between its graphs leaves to a training step.

Dynamo runs a frame eagerly when it cannot resume inside it (a graph break inside a loop), and
never compiles torch's own modules called from such a frame, so some of the model's operators
run outside every graph: Wav2Vec2's encoder adds the position embedding and runs a layer norm
(which saves a hidden state for the backward) outside the graphs of its convolutions and
layers. No plan changes that code, but a step's memory counts what it holds. It is read from
the autograd graph behind the step's outputs after the capture's forward: the eager nodes, the
graphs' runs (`CompiledFunctionBackward` nodes) and where each eager node falls among them by
autograd's sequence numbers (the order the forward made them in).

What is counted (`explorer.program.EagerCode`): what eager code saves for the backward (once
per storage; a graph's own tensor it saves is named, so that a schedule keeping it too is not
counted twice), the gradients it makes for parameters no graph reads, the gradients waiting in
autograd's buffers for eager code or a graph further back while other graphs' backwards run,
the outputs it returns to the user with their tangents (graphs that read one take it for the
user's own), and what its frames hold as each graph starts beyond all that (explorer.frames).
Not read here: what eager code holds only between two graphs' operators (what it saves or
makes after the last graph's forward before its own backward runs, what frames take up and
let go between two graphs' starts): measured when profiling instead (explorer.eagerpeaks).
Counted twice (the safe side): a gradient an eager operator passes on unchanged to two places
(`a + b`).
"""

from __future__ import annotations

import bisect
import functools
import math
from typing import Any

import torch
from torch._C._autograd import SavedTensor

from explorer.frames import DEPTH, Held
from explorer.graph import ValueRef
from explorer.modelstate import reachable_tensors, storage_address
from explorer.program import EagerCode

COMPILED = "CompiledFunctionBackward"  # the autograd node of one run of a compiled graph


def eager_code(
    runs: list[list[tuple[ValueRef, torch.Tensor]]],
    returned: set[int],
    outputs: list[torch.Tensor],
    known: list[torch.Tensor],
    frames: list[list[Held]],
) -> list[EagerCode]:
    """Per run of a graph (in the order they ran), what eager code leaves to the step there.

    `runs`: the values each run read or returned, by their name in its graph; `returned`: the
    storages (addresses) the runs returned; `outputs`: the step's output tensors; `known`: the
    model's tensors and the step's inputs; `frames`: what the model's frames held as each run
    started (explorer.frames)."""
    ran, eager, leaves = _autograd_nodes(outputs)
    made = [_made(node) for node in ran]
    graph_tensors: dict[int, tuple[int, ValueRef]] = {}  # storage: the first run with it
    last_run: dict[int, int] = {}  # storage: the last run with it
    for k, values in enumerate(runs):
        for ref, tensor in values:
            graph_tensors.setdefault(storage_address(tensor), (k, ref))
            last_run[storage_address(tensor)] = k
    state = {storage_address(t) for t in known}
    held = state | {storage_address(t) for t in outputs}  # counted for the whole step
    counted = held | set(graph_tensors)
    kept = set(held)
    saved_from: dict[int, int] = {}  # storage: the run whose forward its save is counted from
    saved_only: set[int] = set()  # storages eager code saved, counted to its node's backward
    found = [EagerCode() for _ in runs]
    last = len(runs)
    # each eager node, with the run it comes before (`last`: after the last run's forward)
    placed = [(bisect.bisect(made, _made(node)), node) for node in eager]
    for before, node in placed:  # earliest first: a storage lives from its first save on
        for tensor in _ctx_attributes(node):  # held with the autograd graph, to the step's end
            storage, nbytes = storage_address(tensor), tensor.untyped_storage().nbytes()
            if storage in saved_only:  # an earlier node saved it: it now lives to the end
                saved_only.remove(storage)
                found[saved_from[storage]].saved -= nbytes
                found[saved_from[storage]].outputs += nbytes
                continue
            if storage in held or storage in saved_from:
                continue
            counted.add(storage)
            saved_from[storage] = before
            if before < last:
                found[before].outputs += nbytes
            else:
                found[-1].backward += nbytes
        for tensor in _saved_tensors(node):
            storage = storage_address(tensor)
            if before == last:
                continue
            if storage not in counted:
                counted.add(storage)
                saved_from[storage] = before
                saved_only.add(storage)
                found[before].saved += tensor.untyped_storage().nbytes()
            elif storage in graph_tensors and storage not in kept:
                kept.add(storage)
                run, ref = graph_tensors[storage]
                nbytes = tensor.untyped_storage().nbytes()
                found[before].kept = (*found[before].kept, (run, ref, nbytes))
    graded: set[int] = set()
    # latest first: the last eager node to read a parameter makes its gradient (its backward
    # runs first), the others add theirs into it
    for before, node in reversed(placed):
        for target, _ in node.next_functions:
            if hasattr(target, "variable"):  # AccumulateGrad: a parameter or an input
                leaf = storage_address(target.variable)
                if leaf not in graded and leaf not in graph_tensors:
                    graded.add(leaf)
                    if before < last:
                        found[before].grads += _bytes(target.variable)
                    else:
                        found[-1].backward += _bytes(target.variable)
    _waiting(found, ran, placed)
    # a graph that only reads an output eager code made takes it for the user's (counted by
    # none): Switch Transformers' encoder output, its last dropout's, read by the decoder
    _eager_outputs(found, made, outputs, state | returned, frames)
    _leaves_graphs_read(found, leaves, last_run, held)
    for run, held_then in enumerate(frames):  # beyond what is counted elsewhere by then
        for storage in held_then:
            first = graph_tensors.get(storage.address, (run + 1, None))[0]
            if storage.alive and (
                storage.address in held
                or first <= run  # a graph's tensor by then (an input made for a later one)
                or saved_from.get(storage.address, run + 1) <= run
            ):
                continue
            found[run].locals += storage.nbytes
    return found


def compiled_runs(outputs: list[torch.Tensor]) -> list[Any]:
    """The autograd nodes of the graphs' runs behind `outputs`, in the order they ran."""
    return _autograd_nodes(outputs)[0]


def unreached_parameters(model: torch.nn.Module, outputs: list[torch.Tensor]) -> list[Any]:
    """The model's parameters that ask for a gradient but that the autograd graph behind
    `outputs` does not reach: code that runs autograd itself inside a custom Function's
    backward makes their gradients (Reformer's reversible layers run each layer again there
    and backpropagate through it), which no graph and no eager node shows. Parameters the step
    does not use are among them; they get no gradient, which the measurement sees."""
    _, _, leaves = _autograd_nodes(outputs)
    reached = {storage_address(leaf) for leaf in leaves}
    return [p for p in model.parameters() if p.requires_grad and storage_address(p) not in reached]


def parameters_outside_graphs(
    model: torch.nn.Module, graph_tensors: list[torch.Tensor], unreached: list[torch.Tensor]
) -> list[str]:
    """The names of the model's parameters that ask for a gradient and that the step's
    autograd graph reaches (`unreached`: those it does not, `unreached_parameters`), but that
    no graph reads (`graph_tensors`: what the graphs read): eager code uses them, where no plan
    reaches. Dynamo runs a forward eagerly from a graph break it cannot resume after to the
    forward's end (at an `nn.LSTM` or `nn.GRU`, which it meets as an attribute, not a call),
    so the layers there keep what they save whole."""
    elsewhere = {storage_address(t) for t in [*graph_tensors, *unreached]}
    return [
        name
        for name, p in model.named_parameters()
        if p.requires_grad and storage_address(p) not in elsewhere
    ]


def saved_by_eager_code(outputs: list[torch.Tensor]) -> set[int]:
    """The storages (addresses) eager code behind `outputs` saved for its backward."""
    _, eager, _ = _autograd_nodes(outputs)
    return {storage_address(t) for node in eager for t in _saved_tensors(node)}


def _waiting(found: list[EagerCode], ran: list[Any], placed: list[tuple[int, Any]]) -> None:
    """The gradients that eager code returns, or is handed, and that wait in autograd's
    buffers for their reader's backward while whole graphs' backwards run: from eager code
    or a graph for an earlier graph's output or for eager code further back (left out, a
    graph's gradient for the encoder output that T5's user holds and every decoder layer's
    graph reads was 2,048 bytes under the measured through the layers between).

    Positions in the forward, doubled: a graph's run m at 2m, eager code just before it at
    2m - 1. A gradient made at p for a reader at c waits through the runs m with c < 2m < p;
    an input of a reader's that several write to waits from the first (the latest) on."""
    position = {node: 2 * m for m, node in enumerate(ran)}
    position |= {node: 2 * before - 1 for before, node in placed}
    arrived: set[tuple[Any, int]] = set()
    for maker in sorted(position, key=position.__getitem__, reverse=True):
        made = position[maker]
        for reader, k in maker.next_functions:
            if reader not in position or (reader, k) in arrived:
                continue
            read = position[reader]
            arrived.add((reader, k))
            metadata = reader._input_metadata[k]
            nbytes = math.prod(metadata.shape) * metadata.dtype.itemsize
            for between in range(read // 2 + 1, (made + 1) // 2):
                found[between].waiting += nbytes


def _eager_outputs(
    found: list[EagerCode],
    made: list[int],
    outputs: list[torch.Tensor],
    not_eager: set[int],
    frames: list[list[Held]],
) -> None:
    """The step's outputs that eager code made, and the user's tangents for them. One without
    an autograd node (Reformer's cache states) is placed by the first run whose frames held it
    as it started (`frames`), or after the last run's forward if none did."""
    counted = set(not_eager)
    held_at = [{held.address for held in run} for run in frames]
    for tensor in outputs:
        storage = storage_address(tensor)
        if storage in counted:
            continue
        counted.add(storage)
        node = tensor.grad_fn
        if node is not None:
            before = bisect.bisect(made, _made(node))
        else:
            before = next((k for k, held in enumerate(held_at) if storage in held), len(found))
        if before < len(found):
            found[before].outputs += tensor.untyped_storage().nbytes()
        else:
            found[-1].backward += tensor.untyped_storage().nbytes()
        if tensor.requires_grad:
            found[-1].backward += _bytes(tensor)


def _leaves_graphs_read(
    found: list[EagerCode],
    leaves: list[torch.Tensor],
    last_run: dict[int, int],
    held: set[int],
) -> None:
    """Tensors the step makes as leaves that ask for a gradient, read by a graph (transformers'
    T5 under gradient checkpointing makes its cross-attention's zero position bias one): the
    graph counts one as its input through the forward, but autograd holds it to the step's
    end, with the gradient it accumulates from the backward of the last graph to read it.
    (Left out, T5's step was 2,048 bytes under the prediction through the backward, 4,096
    after that graph's.) `last_run`: each storage's last run to read or return it."""
    for leaf in leaves:
        storage = storage_address(leaf)
        if storage in held or storage not in last_run:  # the model's, or no graph reads it
            continue
        found[-1].backward += leaf.untyped_storage().nbytes()
        found[last_run[storage]].grads += _bytes(leaf)


def _autograd_nodes(outputs: list[torch.Tensor]) -> tuple[list[Any], list[Any], list[Any]]:
    """The autograd nodes behind `outputs` of the graphs' runs and of eager code (neither a
    run nor a gradient's accumulation), each in the order the forward made them, and the
    leaves whose gradients are accumulated."""
    ran, eager, leaves = [], [], []
    seen: set[Any] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        stack += [n for n, _ in node.next_functions if n is not None]
        if type(node).__name__ == COMPILED:
            ran.append(node)
        elif hasattr(node, "variable"):
            leaves.append(node.variable)
        else:
            eager.append(node)
    return sorted(ran, key=_made), sorted(eager, key=_made), leaves


def _made(node: Any) -> int:
    """When the forward made an autograd node: its sequence number."""
    return node._sequence_nr()


def _saved_tensors(node: Any) -> list[torch.Tensor]:
    """The tensors an eager autograd node saved for its backward (its `_saved_*` fields; a custom
    autograd.Function's, what its forward gave `ctx.save_for_backward`, which were missed: the
    test's Function that keeps its input was 65,536 bytes under) but 0-dim ones: a number
    Python passed is one (`x * 2` saves the 2, which no allocator's count holds), and a real
    one is a few bytes."""
    found = []
    names = [name for name in dir(node) if name.startswith("_saved_")]
    if _is_custom_function(node):
        names.append("saved_tensors")
    for name in names:
        try:
            found += _held_for(node, name)
        except RuntimeError:  # released already
            continue
    return [v for v in found if isinstance(v, torch.Tensor) and v.dim() > 0]


def _ctx_attributes(node: Any) -> list:
    """Tensors a custom autograd.Function's forward put on its ctx as attributes, alone or in
    a list or tuple (Reformer's LSH attention keeps its buckets and sorting indices so): its
    node is the ctx and holds them as long as it lives, past its backward (which frees only
    what `save_for_backward` kept), while the step's outputs hold the autograd graph. One an
    earlier eager node saved lives from that save to the end; a graph that saves one too
    counts it again (the safe side)."""
    if not _is_custom_function(node):
        return []
    found = []
    for value in vars(node).values():
        found += value if isinstance(value, (list, tuple)) else [value]
    return [v for v in found if isinstance(v, torch.Tensor)]


def _is_custom_function(node: Any) -> bool:
    """Whether the autograd node is a custom autograd.Function's (its ctx)."""
    return hasattr(node, "_raw_saved_tensors")


def _held_for(node: Any, name: str) -> list:
    """What the node holds for its saved field `name`. A field packed by saved-tensor hooks
    holds what the pack hook returned, read without unpacking: torch.utils.checkpoint's is a
    placeholder, and unpacking it recomputes the region, whose tensors are freed in the step
    (counted as saved, a checkpointed region run eagerly was 19% over its measured peak;
    transformers' T5 with gradient checkpointing 13 to 15%)."""
    raw = getattr(node, "_raw_" + name.removeprefix("_"), None)
    raws = raw if isinstance(raw, (list, tuple)) else [raw]
    if any(getattr(r, "unpack_hook", None) is not None for r in raws):
        packed = [getattr(r, "data", None) for r in raws]
        held = [t for p in packed for t in (p if isinstance(p, (list, tuple)) else [p])]
        return held + [t for r in raws for t in _kept_to_recompute(r.unpack_hook)]
    value = getattr(node, name)
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _kept_to_recompute(unpack_hook: Any) -> list[torch.Tensor]:
    """The inputs a torch.utils.checkpoint region keeps until its backward recomputes it:
    its frame (`frame` in the unpack hook's closure) saves the positional ones and its
    recompute function's closure holds the function (a `functools.partial`, as transformers'
    layers pass their keyword arguments) and the keyword arguments. Nothing for other hooks.
    (Left out, the region's input was 2,048 bytes under what transformers' T5 with gradient
    checkpointing held.)"""
    frame = _closure(unpack_hook).get("frame")
    saved_args = getattr(frame, "saved_args", None)
    if not isinstance(saved_args, list):
        return []
    values: list[Any] = [a.unpack() if isinstance(a, SavedTensor) else a for a in saved_args]
    recompute = _closure(getattr(frame, "recompute_fn", None))
    function = recompute.get("fn")
    if isinstance(function, functools.partial):
        values += [list(function.args), function.keywords]
    values.append(recompute.get("kwargs", {}))
    return reachable_tensors(values, DEPTH)


def _closure(function: Any) -> dict[str, Any]:
    """A Python function's closure variables by name ({} for anything else)."""
    code, cells = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or not cells:
        return {}
    found = {}
    for name, cell in zip(code.co_freevars, cells, strict=True):
        try:
            found[name] = cell.cell_contents
        except ValueError:  # an empty cell
            continue
    return found


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
