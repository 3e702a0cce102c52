"""Leaving a model as it was found: planning and measuring run real steps on the user's model.

A capture runs the model's forward for real, and the peers' measurements run whole training
steps; neither may change what the user trains. `kept` puts back, on exit, the buffers
(BatchNorm running statistics and counters), the gradients of the parameters and of leaf
inputs, every module's train/eval flag, the random generators' states (torch's CPU one and
those of the CUDA devices in use, NumPy's and Python's global ones), and the values of the
inputs and of the parameters, which a forward may write into (`InputValues`,
`ParameterValues`).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils._pytree import tree_leaves

try:
    import numpy
except ImportError:  # an exported file's runtime needs torch alone (docs/API.md)
    numpy = None

# the seed a planned or verified step draws from: verify's step (explorer.verify) and the
# captured forward (explorer.capture) alike, so that a branch on a random draw (LayerDrop)
# takes one path in both, whatever the caller's random state
STEP_SEED = 0


@contextmanager
def kept(model: nn.Module, inputs: Any, seed: int | None = None) -> Iterator[None]:
    """Restore the model's state on exit (see the module docstring). `seed`: seed the
    generators it puts back (CPU, and the CUDA devices in use) on entry, as
    `torch.manual_seed` does for the step verify runs."""
    buffers = BufferValues(model)
    parameters = ParameterValues(model)
    values = InputValues(inputs)
    grads = [(t, t.grad) for t in grad_holders(model, inputs)]
    modes = [(m, m.training) for m in model.modules()]
    cuda = _cuda_devices(model, inputs)
    numpy_state = numpy.random.get_state() if numpy is not None else None
    python_state = random.getstate()
    with torch.random.fork_rng(devices=cuda):
        if seed is not None:
            torch.random.default_generator.manual_seed(seed)
            for index in cuda:
                torch.cuda.default_generators[index].manual_seed(seed)
            seed_host_generators(seed)
        try:
            yield
        finally:
            if numpy is not None:
                numpy.random.set_state(numpy_state)
            random.setstate(python_state)
            buffers.restore()
            parameters.restore()
            values.restore()
            for tensor, grad in grads:
                tensor.grad = grad
            for module, training in modes:
                module.training = training


class BufferValues:
    """Each module's buffers as they were: the tensor under each name and a copy of its
    value. A forward may assign another tensor to a buffer's name (`self.calls = self.calls
    + 1`), or change a buffer's shape (the observers of quantization-aware training start
    with empty `min_val` and `max_val` and `resize_` them at their first call); both are put
    back. A buffer whose shape changed gets its copy in its place, so that the tensor the
    forward resized stays as the graphs captured it. Lazy buffers keep what a forward made
    them (materialized)."""

    def __init__(self, model: nn.Module) -> None:
        self._names = [
            (module, name, buffer)
            for module in model.modules()
            for name, buffer in module._buffers.items()
            if buffer is not None and not is_lazy(buffer)
        ]
        self._values = {id(buffer): buffer.detach().clone() for _, _, buffer in self._names}

    def restore(self) -> None:
        with torch.no_grad():
            for module, name, buffer in self._names:
                value = self._values[id(buffer)]
                if buffer.shape == value.shape:
                    buffer.copy_(value)  # in place: a buffer shared by two modules stays so
                    module._buffers[name] = buffer
                else:
                    module._buffers[name] = value


class ParameterValues:
    """The parameters' values as they were (copies on the host), put back into those a run
    wrote into (their version counter moved) or gave other memory (`p.data = ...`, which
    moves no counter). A forward may do either: `nn.Embedding(max_norm=...)` renormalizes
    the rows it looks up in place, and MoCo moves its key encoder towards its query encoder
    in the forward. Planning's runs left the user's model so (the embedding renormalized at
    the example's rows, the key encoder a few steps on)."""

    def __init__(self, model: nn.Module) -> None:
        # each storage is held, so no other can take its address while this is alive
        self._saved = [
            (
                parameter,
                parameter._version,
                parameter.untyped_storage(),
                _on_host(parameter.detach()),
            )
            for parameter in model.parameters()
            if parameter.device.type != "meta"
        ]

    def restore(self) -> None:
        """Values are copied into the memory a parameter has now (the memory the step's
        graphs read, which their captures identify it by); only one whose shape changed gets
        its old tensor's place back."""
        with torch.no_grad():
            for parameter, version, storage, value in self._saved:
                moved = parameter.untyped_storage().data_ptr() != storage.data_ptr()
                if parameter.shape != value.shape:
                    parameter.data = value.to(parameter.device)
                elif moved or parameter._version != version:
                    parameter.copy_(value)


class InputValues:
    """The bytes of the inputs as they were (the stretch of its storage each input covers,
    kept on the host), to put back or compare with. A forward that writes into its input
    (`x.mul_(2)`, `x /= 255`) leaves each later run of the step another input, and the
    caller's tensor changed: verify's unmodified run doubled the input its scheduled run then
    read, and the float64 run read it doubled again, so that outputs 2.4e5 apart passed as
    no further from float64 than the unmodified model's."""

    def __init__(self, inputs: Any) -> None:
        spans: dict[int, tuple[torch.UntypedStorage, int, int]] = {}
        for tensor in tensors_in(inputs):
            if tensor.layout != torch.strided or tensor.device.type == "meta" or not tensor.numel():
                continue
            storage, address = tensor.untyped_storage(), storage_address(tensor)
            start, end = _byte_span(tensor)
            _, first, last = spans.get(address, (storage, start, end))
            spans[address] = (storage, min(first, start), max(last, end))
        self._saved = [
            (storage, start, _on_host(_bytes(storage)[start:end]))
            for storage, start, end in spans.values()
        ]

    def written(self) -> bool:
        """Whether an input's bytes differ from what they were."""
        return any(
            not torch.equal(_bytes(storage)[start : start + len(saved)].cpu(), saved)
            for storage, start, saved in self._saved
        )

    def restore(self) -> None:
        for storage, start, saved in self._saved:
            _bytes(storage)[start : start + len(saved)].copy_(saved)


def _byte_span(tensor: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage a tensor's elements lie in: [start, end) (strides are never
    negative in PyTorch)."""
    extent = 1 + sum((n - 1) * step for n, step in zip(tensor.shape, tensor.stride(), strict=True))
    start = tensor.storage_offset() * tensor.element_size()
    return start, start + extent * tensor.element_size()


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """A copy on the host (one copy, from any device)."""
    return tensor.clone() if tensor.device.type == "cpu" else tensor.cpu()


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage's bytes as a uint8 tensor on its device (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def seed_host_generators(seed: int) -> None:
    """Seed NumPy's and Python's global generators, which a model's eager code may draw from
    (transformers' HuBERT and Wav2Vec2 draw their SpecAugment masks with NumPy): a planned or
    verified step draws the same from them whatever the caller drew before."""
    if numpy is not None:
        numpy.random.seed(seed)
    random.seed(seed)


def copy_model(model: nn.Module) -> nn.Module:
    """A deep copy of `model`. A tensor that a module keeps from its last forward (RAFT keeps
    its correlation pyramid so) has a `grad_fn`, and deepcopy refuses such tensors: the copy
    gets it detached."""
    memo = {id(t): t.detach().clone() for t in held_tensors(model) if not t.is_leaf}
    return copy.deepcopy(model, memo)


def held_state(model: nn.Module) -> list[torch.Tensor]:
    """The tensors the model holds from step to step: `held_tensors` but those a module kept
    from a forward (RAFT's correlation pyramid, with a `grad_fn`: activations, which the
    step makes again)."""
    return [t for t in held_tensors(model) if t.grad_fn is None]


def held_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor the model holds: its parameters and buffers, and tensors its modules keep
    as attributes (a cache, or RAFT's correlation pyramid), in lists, tuples and dicts too."""
    return [
        tensor
        for module in model.modules()
        for value in vars(module).values()
        for tensor in tree_leaves(value)
        if isinstance(tensor, torch.Tensor)
    ]


def as_trained(model: nn.Module) -> nn.Module:
    """`model` in the modes it trains in: a model wholly in eval mode (transformers'
    from_pretrained returns one) is put in train mode; otherwise its layers keep their modes,
    since layers a user put in eval (frozen BatchNorm, while fine-tuning) train so."""
    if not any(m.training for m in model.modules()):
        model.train()
    return model


def grad_holders(model: nn.Module, inputs: Any) -> list[torch.Tensor]:
    """Parameters and leaf inputs: the tensors whose ``.grad`` a step fills."""
    return [*model.parameters(), *(x for x in tensors_in(inputs) if x.is_leaf)]


def clear_grads(model: nn.Module, inputs: Any) -> None:
    """Start the next step without gradients: every grad holder's `.grad` set to None."""
    for tensor in grad_holders(model, inputs):
        tensor.grad = None


def tensors_in(inputs: Any) -> list[torch.Tensor]:
    """Every tensor in a nest of tuples, lists and dicts (positional and keyword inputs)."""
    return [x for x in tree_leaves(inputs) if isinstance(x, torch.Tensor)]


def step_inputs_and_state(model: Any, inputs: Any) -> list[torch.Tensor]:
    """The tensors that existed before a step's outputs (`output_tensors`' `known`): the
    inputs', and, for a module, every tensor it holds, taken after the forward (a module may
    keep new ones as attributes). A plain function's step holds none of its own."""
    known = tensors_in(inputs)
    if isinstance(model, nn.Module):
        known += held_tensors(model)
    return known


def output_tensors(
    result: Any, known: Callable[[], list[torch.Tensor]] | None = None
) -> list[torch.Tensor]:
    """The tensors a model's result holds: those of its nest of tuples, lists, dicts and
    registered pytree nodes (`ModelOutput`), in that order, then the step's tensors inside
    objects that pytree does not open, found through their attributes, lists, tuples and
    dicts, depth first: a transformers `DynamicCache` (`use_cache=True`) holds each layer's
    key and value states so. The step's are those with a `grad_fn`, and, given the tensors
    that existed before the step (`known()`: the model's and the inputs), every other one:
    Reformer's cache holds states its custom Function made without a `grad_fn` (8,192 bytes
    the user holds to the step's end). Modules are not searched: their parameters are not
    outputs. `known` is called only when such an object holds a tensor without a `grad_fn`:
    gathering the model's tensors took 1.7 ms of sample:unet b2 32 px's 21 ms step, inside
    the steps that time it."""
    leaves = tree_leaves(result)
    found = [x for x in leaves if isinstance(x, torch.Tensor)]
    inside = reachable_tensors([x for x in leaves if not isinstance(x, torch.Tensor)])
    if known is None or all(x.grad_fn is not None for x in inside):
        return found + [x for x in inside if x.grad_fn is not None]
    existed = {storage_address(t) for t in known()}
    return found + [x for x in inside if x.grad_fn is not None or storage_address(x) not in existed]


def reachable_tensors(values: list[Any], depth: int | None = None) -> list[torch.Tensor]:
    """The tensors among `values` and inside their dicts, lists, tuples and plain objects'
    fields, depth first in order, each once, opening at most `depth` levels (None: all).
    Modules, classes and strings are not opened: a module's tensors are the model's."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [(value, depth) for value in reversed(values)]
    while stack:
        item, left = stack.pop()
        if id(item) in seen or isinstance(item, (nn.Module, type, str, bytes)):
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            found.append(item)
            continue
        if left == 0:
            continue
        if isinstance(item, dict):
            inner = list(item.values())
        elif isinstance(item, (list, tuple)):
            inner = list(item)
        else:
            inner = list(getattr(item, "__dict__", {}).values())
        below = None if left is None else left - 1
        stack.extend((value, below) for value in reversed(inner))
    return found


def storage_address(tensor: torch.Tensor) -> int:
    """The address of the storage behind `tensor`: the same for its views, and unique among
    the storages alive at one time. On the meta device no memory stands behind a storage
    (every address reads 0): its Python object, one for the storage's whole life, tells it."""
    storage = tensor.untyped_storage()
    return id(storage) if tensor.device.type == "meta" else storage.data_ptr()


def device_of(model: nn.Module, inputs: Any) -> torch.device:
    """The model's device (its first parameter's), else the first input's, else the CPU."""
    first = next(model.parameters(), None)
    if first is None:
        first = next(iter(tensors_in(inputs)), None)
    return first.device if first is not None else torch.device("cpu")


def generator_states(model: nn.Module, inputs: Any) -> list[torch.Tensor]:
    """The states of the generators a step of `model` on `inputs` draws from (the CPU's, and
    those of the CUDA devices in use): two runs that drew the same random numbers from the
    same states end in equal ones."""
    cuda = [torch.cuda.get_rng_state(index) for index in _cuda_devices(model, inputs)]
    return [torch.get_rng_state(), *cuda]


def drew_alike(states: list[torch.Tensor], others: list[torch.Tensor]) -> bool:
    """Whether two lists of `generator_states` are the same states."""
    return all(torch.equal(a, b) for a, b in zip(states, others, strict=True))


def _cuda_devices(model: nn.Module, inputs: Any) -> list[int]:
    """The CUDA devices of the inputs' tensors and the model's, by index."""
    cuda = {_cuda_index(t.device) for t in tensors_in(inputs) if t.device.type == "cuda"}
    device = device_of(model, inputs)
    if device.type == "cuda":
        cuda.add(_cuda_index(device))
    return sorted(cuda)


def _cuda_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()
