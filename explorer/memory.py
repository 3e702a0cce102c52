"""Measuring the memory and time of one training step, on CPU as on GPU.

On GPU the caching allocator already counts every byte, so we read its statistics. On CPU
there is no such counter, so `LiveBytesTracker` watches every ATen operator through a
`TorchDispatchMode` and adds up the bytes of the tensor storages that are alive.

What the CPU meter does not see: memory that kernels allocate for themselves rather than as
tensors. The largest such item is oneDNN's scratch memory in convolutions (mostly the
convolution backward): at small batches and thread counts it can be tens of MiB that only
`torch.profiler` (``profile_memory=True``) reports. Nor does it see the Python objects, the
allocator's caches or anything created before the tracker was entered. It counts tensors, the
same quantity the solver plans, so it is the meter to compare predictions against; report the
profiler beside it when the gap matters.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["LiveBytesTracker", "requested_bytes", "tensor_bytes", "time_step"]


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (tied weights and views count once)."""
    storages = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[id(storage)] = storage
    return sum(storage.nbytes() for storage in storages.values())


class _NewStorageMode(TorchDispatchMode):
    """Hands every operator's inputs and outputs to the tracker that owns this mode."""

    def __init__(self, on_op: Callable[[Any, Any, Any], None]) -> None:
        super().__init__()
        self._on_op = on_op

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Let torch.compile trace and compile while we watch: a compiled model is measured
        running its compiled code (otherwise Dynamo would fall back to eager under the mode)."""
        return True

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self._on_op(func, (args, kwargs), out)
        return out


class LiveBytesTracker:
    """Context manager: live and peak tensor bytes allocated inside the block.

    ``current_bytes`` and ``peak_bytes`` are relative to entry: tensors that existed before
    ``__enter__`` are not counted, and freeing them does not lower the count, but for the
    storages of ``held`` (CPU): the model's parameters and buffers, counted beside the
    block's bytes, whose release inside it lowers the count (a forward that gives its
    parameters new memory, `p.data = ...`, as MoCo moves its key encoder, frees the old).
    After ``__exit__`` both numbers stay as they were at exit.

    CPU (``device="cpu"``): every operator's output storages that are new (not an input's
    storage, so views and in-place results do not count twice) are counted at their full
    ``nbytes()`` and uncounted when the storage is freed. Since PyTorch 2.1 a storage keeps
    one Python object for its whole life, so a ``weakref.finalize`` on
    ``tensor.untyped_storage()`` fires exactly when the memory is released, whichever tensor
    or view held it last. Operators run by the autograd engine (gradients, their
    accumulation, ``autograd.Function.backward``) are seen, because the engine runs CPU work
    on the calling thread with the caller's dispatch modes. Not seen: kernel scratch memory
    (oneDNN convolution workspace), non-tensor allocations, and code that bypasses the
    dispatcher. The mode costs some Python per operator, so time steps without it.

    CUDA (``device="cuda"``): the caching allocator's ``requested_bytes`` statistics minus
    what was requested at entry: every byte asked of the allocator, tensors and kernel
    workspaces alike, before it rounds a request up to its 512-byte grain or hands out a
    whole cached block that it does not split (the quantity the planner predicts). Beside
    it, ``peak_allocated_bytes`` (``max_memory_allocated``: the blocks handed out, rounding
    included) and ``peak_reserved_bytes`` (``max_memory_reserved``: what the allocator held
    at most, which is what decides an out-of-memory error). Entering resets the process-wide
    peak statistics of that device.
    """

    def __init__(
        self,
        device: str | torch.device = "cpu",
        after_op: Callable[[str, int], None] | None = None,
        held: Iterable[torch.Tensor] = (),
    ) -> None:
        """`after_op` (CPU only): called after every operator with its name (`aten.mm.default`)
        and the live bytes then, to find where a prediction and the run part ways. `held`:
        tensors alive before entry whose release inside the block lowers the count."""
        self.device = torch.device(device)
        self._after_op = after_op
        self._held = {id(t.untyped_storage()): t.untyped_storage() for t in held}
        self._lock = threading.RLock()
        self._live: dict[int, tuple[int, weakref.finalize]] = {}
        self._mode: _NewStorageMode | None = None
        self._active = False
        self._current = 0
        self._peak = 0
        self._requested_base = 0
        self._allocated_base = 0
        self._allocated_peak: int | None = None
        self._reserved_peak: int | None = None

    @property
    def _is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def __enter__(self) -> LiveBytesTracker:
        if self._active:
            raise RuntimeError("LiveBytesTracker is not reentrant")
        self._active = True
        self._current = self._peak = 0
        if self._is_cuda:
            torch.cuda.synchronize(self.device)
            self._requested_base = requested_bytes(self.device)[0]
            self._allocated_base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            for key, storage in self._held.items():
                if storage.device == self.device and storage.nbytes():
                    release = weakref.finalize(storage, self._remove, key)
                    self._live[key] = (storage.nbytes(), release)
            self._held.clear()  # the finalizers alone may keep track of them
            self._mode = _NewStorageMode(self._record_outputs)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._is_cuda:
            self._read_cuda()
        else:
            self._mode.__exit__(*exc_info)
            self._mode = None
            self._forget_storages()
        self._active = False

    @property
    def current_bytes(self) -> int:
        """Bytes allocated inside the block and still alive (at exit, once exited)."""
        if self._active and self._is_cuda:
            self._read_cuda()
        return self._current

    @property
    def peak_bytes(self) -> int:
        """Most bytes alive at once since entry."""
        if self._active and self._is_cuda:
            self._read_cuda()
        return self._peak

    @property
    def peak_allocated_bytes(self) -> int | None:
        """CUDA only: the most bytes of allocator blocks handed out since entry (requests
        rounded up, unsplit cached blocks whole); None on CPU."""
        if self._active and self._is_cuda:
            self._read_cuda()
        return self._allocated_peak

    @property
    def peak_reserved_bytes(self) -> int | None:
        """CUDA only: the caching allocator's peak reservation (absolute); None on CPU."""
        if self._active and self._is_cuda:
            self._read_cuda()
        return self._reserved_peak

    def _read_cuda(self) -> None:
        torch.cuda.synchronize(self.device)
        current, peak = requested_bytes(self.device)
        self._current = current - self._requested_base
        self._peak = peak - self._requested_base
        self._allocated_peak = torch.cuda.max_memory_allocated(self.device) - self._allocated_base
        self._reserved_peak = torch.cuda.max_memory_reserved(self.device)

    def _record_outputs(self, func: Any, inputs: Any, outputs: Any) -> None:
        """Count each output storage that no input owns and that is not counted yet."""
        input_storages = {id(t.untyped_storage()) for t in _tensors(inputs)}
        for tensor in _tensors(outputs):
            storage = tensor.untyped_storage()
            key = id(storage)
            if key in input_storages or key in self._live or storage.device != self.device:
                continue
            nbytes = storage.nbytes()
            if nbytes:
                self._add(key, nbytes, weakref.finalize(storage, self._remove, key))
        if self._after_op is not None:
            self._after_op(str(func), self._current)

    def _add(self, key: int, nbytes: int, finalizer: weakref.finalize) -> None:
        with self._lock:
            self._live[key] = (nbytes, finalizer)
            self._current += nbytes
            self._peak = max(self._peak, self._current)

    def _remove(self, key: int) -> None:
        """Finalizer: the storage was freed. The id cannot be reused before this runs."""
        with self._lock:
            nbytes, _ = self._live.pop(key)
            self._current -= nbytes

    def _forget_storages(self) -> None:
        """Stop watching: later frees must not call back into an exited tracker."""
        with self._lock:
            for _, finalizer in self._live.values():
                finalizer.detach()
            self._live.clear()


def requested_bytes(device: torch.device) -> tuple[int, int]:
    """The bytes asked of the CUDA caching allocator now and at most since its peak statistics
    were last reset, as asked (before rounding): what tensors and workspaces occupy."""
    stats = torch.cuda.memory_stats(device)
    return stats["requested_bytes.all.current"], stats["requested_bytes.all.peak"]


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def time_step(step_fn: Callable[[], None], device: str | torch.device = "cpu") -> float:
    """Seconds for one call of `step_fn`; on CUDA, synchronized so queued kernels count."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step_fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start
