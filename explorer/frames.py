"""What the Python frames of a model's eager code hold when one of its graphs starts to run.

Between its graphs a model runs Python: a frame Dynamo runs eagerly (a graph break inside a
loop), torch's own modules called from it, the code of a split. Its locals are memory the plan
cannot change but the step holds: Faster R-CNN's RoI pooling fills a zeroed tensor of all the
boxes' features (51 MB) while two graphs run. Autograd's graph shows what eager code saves
(explorer.eager); what its frames merely hold is read here, at each graph run's start, by
walking the Python stack from that run up to the capture, through the frames of the model's
code (not PyTorch's machinery below torch.nn, nor this package's) and the containers and plain
objects in their locals. The parameters and buffers of the modules they hold are the model's
state, counted for the whole step, whatever memory they have then: a forward that gives them
new memory (MoCo's `p.data = ...` moving its key encoder, `self.calls = self.calls + 1`)
frees the old, which had been counted as frames' memory (the whole key encoder, over the
measured peak).
"""

from __future__ import annotations

import os
import sys
import warnings
from types import CodeType, FrameType

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from explorer.modelstate import reachable_tensors, storage_address

_TORCH = os.path.dirname(torch.__file__) + os.sep
_TORCH_NN = os.path.dirname(nn.__file__) + os.sep
_HERE = os.path.dirname(__file__) + os.sep
DEPTH = 3  # containers and objects opened below a frame's locals


class Held:
    """A storage a frame held: its address and bytes then, and whether it is still alive."""

    def __init__(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        self.address = storage_address(tensor)
        self.nbytes = storage.nbytes()
        self._alive = StorageWeakRef(storage)

    @property
    def alive(self) -> bool:
        return not self._alive.expired()


def held_by_frames(stop: CodeType) -> list[Held]:
    """The storages the model's frames hold now, each once, up to the frame running `stop`."""
    found: dict[int, Held] = {}
    state: set[int] = set()
    frame: FrameType | None = sys._getframe(1)
    with warnings.catch_warnings():  # a deprecated object a frame reaches warns when looked
        # at (torch.distributed.reduce_op, from T5's step): not the user's news
        warnings.simplefilter("ignore", (FutureWarning, DeprecationWarning))
        while frame is not None and frame.f_code is not stop:
            if _is_model_code(frame.f_code.co_filename):
                state |= _state_of(frame.f_locals.values())
                for tensor in reachable_tensors(list(frame.f_locals.values()), DEPTH):
                    if tensor.device.type == "meta":
                        continue
                    try:
                        held = Held(tensor)
                    except RuntimeError:  # no plain storage (sparse)
                        continue
                    found.setdefault(held.address, held)
            frame = frame.f_back
    return [held for address, held in found.items() if address not in state]


def _state_of(values) -> set[int]:
    """The storages of the parameters and buffers of the modules among `values`."""
    modules = [value for value in values if isinstance(value, nn.Module)]
    return {
        storage_address(t)
        for module in modules
        for t in (*module.parameters(), *module.buffers())
        if t.device.type != "meta"
    }


def _is_model_code(filename: str) -> bool:
    if filename.startswith(_HERE):
        return False
    return not filename.startswith(_TORCH) or filename.startswith(_TORCH_NN)
