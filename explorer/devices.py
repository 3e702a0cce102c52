"""The devices the cost model can plan for, by name: their sustained rates, as plain data.

Kept apart from explorer.costmodel (which needs torch) so that the command line can name
them in its help without importing torch. The rates are data-sheet peaks (dense, no
sparsity) times an efficiency that large kernels reach in practice.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPUTE_EFFICIENCY = 0.6  # share of peak FLOPs that large convolutions and products reach
MEMORY_EFFICIENCY = 0.8  # share of peak bandwidth that streaming kernels reach
MEASURED = "cpu"  # the name of this machine's CPU, whose rates are measured, not listed
PREDICTED = "model:"  # a predicted profile's device: this, then the name planned for


@dataclass(frozen=True)
class Device:
    """Sustained rates of one device (FLOP/s and bytes/s) and its cost per operator."""

    name: str
    flop_rate: float  # float32
    half_flop_rate: float  # float16 / bfloat16 (tensor cores where there are any)
    bandwidth: float
    launch_seconds: float


def _gpu(name: str, fp32: float, half: float, bandwidth: float, launch: float) -> Device:
    return Device(
        name, fp32 * COMPUTE_EFFICIENCY, half * COMPUTE_EFFICIENCY,
        bandwidth * MEMORY_EFFICIENCY, launch,
    )  # fmt: skip


# Data-sheet peaks: FLOP/s float32, float16/bfloat16, bytes/s; seconds per launch
DEVICES: dict[str, Device] = {
    "p100": _gpu("NVIDIA Tesla P100 SXM2 16 GB", 10.6e12, 21.2e12, 732e9, 6e-6),
    "v100": _gpu("NVIDIA Tesla V100 SXM2 32 GB", 15.7e12, 125e12, 900e9, 5e-6),
    "a100": _gpu("NVIDIA A100 SXM4 80 GB", 19.5e12, 312e12, 2039e9, 4e-6),
    "h100": _gpu("NVIDIA H100 SXM5 80 GB", 67e12, 989e12, 3350e9, 3e-6),
}


def device_names() -> list[str]:
    """Every name a plan can be made for: the listed GPUs, then this machine's CPU."""
    return [*DEVICES, MEASURED]
