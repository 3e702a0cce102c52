"""Tracing in threads that end: what must be installed first, from a thread that lasts.

On a CUDA build of PyTorch with no usable GPU (the default Linux wheel on a laptop), entering
a FakeTensorMode, as every Dynamo trace does, installs a stand-in CUDA device guard. Before
pytorch/pytorch#178950 (torch 2.11 has the bug, 2.14 not) the stand-in lived in the
thread-local storage of the thread that installed it while a process-wide registry kept
pointing at it: once that thread ended, the next trace in any thread read freed memory and
the process died. The dashboard runs each job in a thread of its own, so on 2.11 a Verify
after a Sweep killed its kernel, and the page waited for an answer that never came.
"""

from __future__ import annotations


def install_fake_cuda_guard_here() -> None:
    """Install PyTorch's stand-in CUDA device guard, where it needs one, from this thread.

    Call it on a thread that outlives the threads that will trace (the main thread, before
    starting them): later installs then find a guard in place and leave it alone. Where a
    GPU is present the real guard stays and nothing changes.
    """
    import torch

    install = getattr(torch._C, "_ensureCUDADeviceGuardSet", None)
    if install is not None:
        install()
