"""The wrapped module works inside DistributedDataParallel (one process, gloo, 127.0.0.1)."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from helpers import import_schedule, planner, train_step
from torch.nn.parallel import DistributedDataParallel


def test_ddp_gradients_match(tmp_path):
    plan = planner("sample:tiny_cnn", 4, 32)
    front = plan.sweep(points=4)
    path = front.points[0].schedule.export(tmp_path / "tiny_ddp.py")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        reference = copy.deepcopy(plan.model)
        ddp = DistributedDataParallel(import_schedule(path).wrap(copy.deepcopy(plan.model)))
        train_step(reference, plan.example_inputs, seed=3)
        train_step(ddp, plan.example_inputs, seed=3)
        for a, b in zip(reference.parameters(), ddp.module.model.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad)
    finally:
        dist.destroy_process_group()
