"""Build a model and its example input from a SPEC string, the same way everywhere.

The command line, the dashboard, verification and the tests all name models by SPEC, so
that an exported schedule can say which model and input it was made for and be rebuilt.
A SPEC is one of:

- a torchvision classification model name, e.g. ``resnet50`` (built with ``weights=None``:
  random weights, nothing is ever downloaded);
- ``sample:NAME`` for a model in ``sample_models`` (``unet``, ``gpt``, ``tiny_mlp`` ...);
- ``package.module:factory`` for the user's own code: the module is imported and the factory
  called with no arguments; it returns an ``nn.Module``, or ``(module, args)``, or
  ``(module, args, kwargs)``, or ``(module, kwargs_dict)`` with its own example inputs (as
  ``torch.export`` takes them: a tensor or tuple of positional inputs, a dict of keyword ones).

Models are built on the CPU right after ``torch.manual_seed(seed)``, so the same seed gives
the same parameters on every device, then moved to the device and put in train mode (but
layers a factory put in eval mode, such as frozen BatchNorm, stay so). Example inputs come
from their own seeded ``torch.Generator``: images are float32 (B, C, S, S), token sequences
int64 (B, T), vectors float32 (B, F). ``input_size`` is S, T or F.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import NamedTuple, TypeVar

import torch
import torchvision
from torch import nn

from explorer.errors import UserError, first_line, message_line
from explorer.modelstate import BufferValues, as_trained
from explorer.units import format_bytes
from sample_models import SAMPLE_MODELS

SAMPLE_PREFIX = "sample:"
LISTING_HINT = "(`remat-explorer models` lists them)"

# Example input size when the user gives none.
TORCHVISION_DEFAULT_SIZE = 224
TORCHVISION_DEFAULT_SIZES = {"inception_v3": 299}
FACTORY_DEFAULT_SIZES = {"image": 224, "sequence": 128}

# Models whose architecture is laid out for one input size: pass the size to the builder.
TORCHVISION_SIZE_KWARGS: dict[str, Callable[[int], dict[str, object]]] = {
    "vit_": lambda s: {"image_size": s},
    "maxvit_": lambda s: {"input_size": (s, s)},
}

# Smallest input size (by name prefix) that gets through a training step at batch 2,
# measured with torchvision 0.29; the rest take any size. inception_v3 needs 299 for its
# auxiliary classifier (kept, as in training). vit_* take multiples of the patch size
# (16, 32 or 14) and maxvit_t sizes 221..224 (mod 224): their builders reject the rest.
TORCHVISION_MIN_SIZES = {
    "alexnet": 63,
    "convnext_": 32,
    "densenet": 29,
    "googlenet": 15,
    "inception_v3": 299,
    "squeezenet1_0": 21,
    "squeezenet1_1": 17,
    "swin_": 4,
    "vgg": 32,
}

_Layer = TypeVar("_Layer", bound=nn.Module)
_BN_BATCH_ONE = "Expected more than 1 value per channel when training"


@dataclass
class ModelSpec:
    """What to build: a SPEC, the batch size and the input size (None: the model's default).
    The batch size is None only for a factory's own inputs without a batch dimension."""

    name: str
    batch_size: int | None
    input_size: int | None

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready dict, for profile, front and exported files."""
        return asdict(self)


@dataclass
class Built:
    """A model ready to profile: in train mode, on its device, with its example inputs.

    kind is "image", "sequence" or "vector", or "custom" when a factory supplied its own
    example inputs (then the spec's batch size is theirs and input_size only labels it).
    """

    model: nn.Module
    example_inputs: tuple[torch.Tensor, ...]
    spec: ModelSpec
    kind: str
    example_kwargs: dict[str, object] = field(default_factory=dict)


def list_specs() -> list[str]:
    """Every SPEC that names a model here: torchvision classifiers, then sample models."""
    names = torchvision.models.list_models(module=torchvision.models)
    return names + [SAMPLE_PREFIX + name for name in SAMPLE_MODELS]


def build(
    spec: str,
    batch_size: int | None,
    input_size: int | None = None,
    device: str = "cpu",
    seed: int = 0,
) -> Built:
    """Build SPEC's model and a deterministic example batch; see the module docstring.

    A factory that returns its own example inputs decides the batch: `batch_size` may then be
    None, and the spec records the inputs' batch (the first dimension of the first tensor
    with one), whatever was passed, so that a front or an export never names a batch the
    step was not traced with; where no input has a batch dimension the number passed is kept.
    Every other model needs `batch_size`.

    Raises UserError, with one line that says what exists or what to change, for an unknown
    SPEC, a factory that cannot be imported or called, a bad device, a missing batch size,
    or a batch or input size the model cannot take (checked by one forward pass on at most two
    samples, after which the RNG state and buffers such as BatchNorm running statistics are
    put back).
    """
    _check_sizes(1 if batch_size is None else batch_size, input_size)
    dev = _device(device)
    torch.manual_seed(seed)
    made = _make(spec, input_size)
    model = as_trained(made.model.to(dev))
    if made.inputs is not None:
        inputs = tuple(_to(x, dev) for x in made.inputs)
        kwargs = {k: _to(v, dev) for k, v in (made.kwargs or {}).items()}
        batch = inputs_batch(inputs, kwargs)
        label = ModelSpec(spec, batch_size if batch is None else batch, input_size)
        return Built(model, inputs, label, "custom", kwargs)
    if batch_size is None:
        raise UserError(
            f"{spec} needs a batch size (--batch-size): its example input is made here; "
            "only a factory that returns its own example inputs goes without"
        )
    cpu_inputs = _example_inputs(model, made.kind, batch_size, made.size, seed, dev)
    inputs = tuple(x.to(dev) for x in cpu_inputs)
    err = _probe(model, inputs, dev)
    if err is not None:
        raise UserError(_size_error(spec, made, batch_size, err))
    return Built(model, inputs, ModelSpec(spec, batch_size, made.size), made.kind)


class _Made(NamedTuple):
    """A freshly constructed (CPU) model and what its example input should be.

    inputs is set only when a factory supplied its own; kind and size are then unused."""

    model: nn.Module
    kind: str
    size: int
    default_size: int
    inputs: tuple | None = None
    kwargs: dict | None = None


def _make(spec: str, input_size: int | None) -> _Made:
    """Dispatch on the SPEC's form: sample:NAME, package.module:factory, torchvision name."""
    if spec.startswith(SAMPLE_PREFIX):
        return _make_sample(spec, input_size)
    if ":" in spec:
        return _make_factory(spec, input_size)
    return _make_torchvision(spec, input_size)


def _make_torchvision(name: str, input_size: int | None) -> _Made:
    """A torchvision classifier with random weights; googlenet/inception keep their aux heads."""
    if name not in torchvision.models.list_models(module=torchvision.models):
        raise UserError(f"unknown model {name!r}; {_suggest(name, list_specs())} {LISTING_HINT}")
    default = TORCHVISION_DEFAULT_SIZES.get(name, TORCHVISION_DEFAULT_SIZE)
    size = input_size or default
    smallest = next((n for p, n in TORCHVISION_MIN_SIZES.items() if name.startswith(p)), 1)
    if size < smallest:
        raise UserError(f"{name} needs --input-size {smallest} or more, not {size}")
    kwargs: dict[str, object] = {"weights": None}
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=True, init_weights=True)
    for prefix, size_kwargs in TORCHVISION_SIZE_KWARGS.items():
        if name.startswith(prefix):
            kwargs.update(size_kwargs(size))
    try:
        model = torchvision.models.get_model(name, **kwargs)
    except (ValueError, AssertionError) as err:  # the builder rejected the size
        raise UserError(
            f"{name} cannot be built for input size {size}: {message_line(err)}"
        ) from None
    return _Made(model, "image", size, default)


def _make_sample(spec: str, input_size: int | None) -> _Made:
    """A model from the sample_models registry, its size checked against the entry's range."""
    name = spec.removeprefix(SAMPLE_PREFIX)
    entry = SAMPLE_MODELS.get(name)
    if entry is None:
        choices = [SAMPLE_PREFIX + n for n in SAMPLE_MODELS]
        raise UserError(f"unknown sample model {spec!r}; {_suggest(spec, choices)} {LISTING_HINT}")
    size = input_size or entry.default_input_size
    low, high = entry.min_input_size, entry.max_input_size
    if size < low or (high is not None and size > high):
        allowed = f"{low}..{high}" if high is not None else f"{low} or more"
        raise UserError(f"{spec} takes --input-size {allowed}, not {size}")
    return _Made(entry.factory(), entry.kind, size, entry.default_input_size)


def _make_factory(spec: str, input_size: int | None) -> _Made:
    """The user's package.module:factory. Unless it returns its own example inputs, the
    input kind and default size are read from the model's first layer."""
    factory = _load_factory(spec)
    try:
        result = factory()
    except (Exception, SystemExit) as err:  # SystemExit too: `sys:exit` must not end the run
        raise UserError(f"the model factory {spec} raised {_describe(err)}") from None
    model, inputs, kwargs = _split_factory_result(result, spec)
    if inputs is not None:
        return _Made(model, "custom", 0, 0, inputs, kwargs)
    kind, default = _infer_input(model, spec)
    return _Made(model, kind, input_size or default, default)


def _load_factory(spec: str) -> Callable[[], object]:
    """Import `package.module` and return its `factory`, callable with no arguments."""
    module_name, _, attr = spec.partition(":")
    dotted_ok = all(part.isidentifier() for part in module_name.split("."))
    if not dotted_ok or not attr.isidentifier():
        raise UserError(
            f"model spec {spec!r} is not a torchvision name, sample:NAME or package.module:factory"
        )
    _importable_from_here()
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise UserError(f"cannot import {module_name!r} for model spec {spec!r}: {err}") from None
    except (Exception, SystemExit) as err:  # the user's module failed while it was imported
        raise UserError(
            f"importing {module_name!r} for model spec {spec!r} raised {_describe(err)}"
        ) from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UserError(f"module {module_name!r} has no callable {attr!r} (model spec {spec!r})")
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise UserError(f"{spec} needs arguments; a factory is called with none") from None
    except ValueError:  # no signature to inspect (some builtins): let the call decide
        pass
    return factory


def _importable_from_here() -> None:
    """Let the current folder's modules be imported: a console script's import path starts at
    its own folder, not where it runs, so `remat-explorer sweep --model mymodels:make` beside
    `mymodels.py` answered "No module named 'mymodels'"."""
    try:
        here = os.getcwd()
    except FileNotFoundError:  # the folder was deleted under this process: nothing to find
        return
    if "" not in sys.path:
        importable_from(here)


def importable_from(folder: str) -> None:
    """Let `folder`'s modules be imported, after everything installed (last on the path), so
    that a file there never shadows an installed module: factory modules of model SPECs."""
    if folder not in sys.path:
        sys.path.append(folder)


def _split_factory_result(result: object, spec: str) -> tuple[nn.Module, tuple | None, dict]:
    """Accept `module`, `(module, args)`, `(module, args, kwargs)` or `(module, kwargs)`, where
    args is a tensor or a tuple and kwargs a dict of keyword inputs."""
    if isinstance(result, nn.Module):
        return result, None, {}
    if isinstance(result, tuple) and len(result) in (2, 3) and isinstance(result[0], nn.Module):
        module, *rest = result
        if len(rest) == 1 and isinstance(rest[0], dict):
            rest = [(), rest[0]]
        args = rest[0]
        args = (args,) if isinstance(args, torch.Tensor) else args
        kwargs = rest[1] if len(rest) == 2 else {}
        if isinstance(args, (tuple, list)) and isinstance(kwargs, dict):
            return module, tuple(args), dict(kwargs)
    raise UserError(
        f"{spec} returned {type(result).__name__}; a factory returns an nn.Module, "
        "(module, args), (module, args, kwargs) or (module, kwargs)"
    )


def inputs_batch(args: tuple, kwargs: dict) -> int | None:
    """The first dimension of the first positional, then keyword, tensor that has one."""
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    return None


def _to(x: object, device: torch.device) -> object:
    return x.to(device) if isinstance(x, torch.Tensor) else x


def _infer_input(model: nn.Module, spec: str) -> tuple[str, int]:
    """Guess kind and default size from the first Conv2d, Embedding or Linear layer."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            return "image", FACTORY_DEFAULT_SIZES["image"]
        if isinstance(module, nn.Embedding):
            return "sequence", FACTORY_DEFAULT_SIZES["sequence"]
        if isinstance(module, nn.Linear):
            return "vector", module.in_features
    raise UserError(
        f"cannot tell what input {spec} takes; make the factory return (model, example_inputs)"
    )


def _example_inputs(
    model: nn.Module, kind: str, batch_size: int, size: int, seed: int, dev: torch.device
) -> tuple[torch.Tensor, ...]:
    """A seeded CPU batch for `kind`: channels and vocabulary come from the model's layers.

    A batch larger than the free memory of this machine (or of `dev`) is refused before it
    is allocated, so that it fails with a line instead of the out-of-memory killer."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "image":
        conv = _first(model, nn.Conv2d)
        channels = conv.in_channels if conv is not None else 3
        shape, dtype = (batch_size, channels, size, size), torch.float32
    elif kind == "sequence":
        shape, dtype = (batch_size, size), torch.int64
    else:
        shape, dtype = (batch_size, size), torch.float32
    _check_fits(math.prod(shape) * dtype.itemsize, batch_size, dev)
    try:
        if kind == "sequence":
            embedding = _first(model, nn.Embedding)
            vocab = embedding.num_embeddings if embedding is not None else 2
            return (torch.randint(0, vocab, shape, generator=gen),)
        return (torch.randn(shape, generator=gen),)
    except RuntimeError as err:  # torch.OutOfMemoryError is one, so is a failed CPU malloc
        raise UserError(
            f"batch size {batch_size} does not fit in memory ({message_line(err)}); "
            "use a smaller --batch-size"
        ) from None


def _check_fits(nbytes: int, batch_size: int, dev: torch.device) -> None:
    """Refuse an example input larger than the free memory where it is made (CPU) and kept."""
    free = [("this machine", _free_cpu_bytes())]
    if dev.type == "cuda":
        free.append((str(dev), torch.cuda.mem_get_info(dev)[0]))
    for where, available in free:
        if available is not None and nbytes > available:
            raise UserError(
                f"batch size {batch_size} needs {format_bytes(nbytes)} for the example input "
                f"alone, more than the {format_bytes(available)} free on {where}; "
                "use a smaller --batch-size"
            )


def _free_cpu_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _probe(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], dev: torch.device
) -> Exception | None:
    """Run one forward on at most two samples, so that a size the model cannot take fails
    here, not deep inside capture. Train mode, so BatchNorm's batch-of-one check applies;
    the RNG state and the buffers are put back, leaving the model as built (lazy modules are
    materialized, and a lazy buffer keeps what the probe wrote into it)."""
    saved = BufferValues(model)
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=_rng_devices(dev)):
            model(*(x[:2] for x in inputs))
    except (RuntimeError, ValueError, AssertionError, IndexError) as err:
        return err
    finally:
        saved.restore()
    return None


def _size_error(spec: str, made: _Made, batch_size: int, err: Exception) -> str:
    """One line that names the size that failed and what to change."""
    if _BN_BATCH_ONE in str(err):
        return (
            f"batch size {batch_size} is too small for {spec} in training mode "
            "(BatchNorm sees one value per channel); use --batch-size 2 or more"
        )
    advice = "a larger" if made.kind == "image" else "another"
    return (
        f"input size {made.size} does not work for {spec} ({message_line(err)}); "
        f"try {advice} --input-size (default {made.default_size})"
    )


def _check_sizes(batch_size: object, input_size: object) -> None:
    """Batch and input sizes are positive ints (input size may be None: the default)."""
    if not _is_int(batch_size) or batch_size < 1:
        raise UserError(f"batch size must be a positive integer, not {batch_size!r}")
    if input_size is not None and (not _is_int(input_size) or input_size < 1):
        raise UserError(f"input size must be a positive integer, not {input_size!r}")


def _device(device: str) -> torch.device:
    """Parse the device and check that it exists on this machine."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UserError(f"unknown device {device!r}; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device {device!r} is not available here (no CUDA); use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise UserError(f"device {device!r} does not exist: {torch.cuda.device_count()} GPU(s)")
    return dev


def _rng_devices(dev: torch.device) -> list[int]:
    """The CUDA devices whose RNG the probe must save (dropout on the GPU draws from them)."""
    if dev.type != "cuda":
        return []
    return [dev.index if dev.index is not None else torch.cuda.current_device()]


def _first(model: nn.Module, layer_type: type[_Layer]) -> _Layer | None:
    """The model's first submodule of `layer_type`, in registration order."""
    return next((m for m in model.modules() if isinstance(m, layer_type)), None)


def _suggest(name: str, choices: list[str]) -> str:
    """'did you mean X?' for the closest choice, or how many choices there are."""
    close = difflib.get_close_matches(name.lower(), choices, n=1, cutoff=0.6)
    return f"did you mean {close[0]}?" if close else f"none of the {len(choices)} models matches"


def _describe(err: BaseException) -> str:
    """'RuntimeError: boom', one line; a SystemExit says it tried to exit."""
    if isinstance(err, SystemExit):
        return f"SystemExit({err.code!r}): it tried to end the program"
    return first_line(err)


def _is_int(value: object) -> bool:
    """True for int but not bool (JSON true would otherwise pass as 1)."""
    return isinstance(value, int) and not isinstance(value, bool)
