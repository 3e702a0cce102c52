"""timm models, built from small configs (no download) with their random layers on (dropout,
stochastic depth): one training step under their lowest front point equals the unmodified
model's, bitwise on the CPU: outputs, parameter gradients and BatchNorm buffers."""

from __future__ import annotations

import pytest
import timm
import torch
from helpers import assert_lowest_point_trains_like_the_model

import explorer

# (name, input size, create_model keywords): families whose steps differ from torchvision's
# convnets: squeeze-excitation with SiLU and stochastic depth drawn per sample
# (efficientnet), shifted-window attention with rolls and a relative position bias (swin),
# rotary position embeddings and SwiGLU (eva02)
MODELS = [
    ("efficientnet_b0", 64, {"drop_rate": 0.2, "drop_path_rate": 0.2}),
    (
        "swin_tiny_patch4_window7_224",
        56,
        {
            "img_size": 56,
            "depths": (1, 1, 2, 1),
            "embed_dim": 32,
            "num_heads": (1, 2, 2, 4),
            "drop_path_rate": 0.1,
        },
    ),
    ("eva02_tiny_patch14_224", 112, {"img_size": 112, "depth": 2, "drop_path_rate": 0.1}),
]


@pytest.mark.parametrize(("name", "size", "config"), MODELS, ids=[m[0] for m in MODELS])
def test_one_training_step_equals_the_model(name, size, config, quick_search):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=10, **config)
    plan = explorer.Planner(model, torch.randn(4, 3, size, size))
    assert_lowest_point_trains_like_the_model(plan)


def test_a_timm_model_is_planned_for_a_gpu_at_a_batch_this_machine_need_not_run():
    # catches: stochastic depth's per-sample draws or squeeze-excitation failing on the meta
    # device, which would leave a timm model unplannable for a device by name
    from explorer.costmodel import model_planner

    name, size, config = MODELS[0]
    model = timm.create_model(name, pretrained=False, num_classes=10, **config)
    plan = model_planner(model, torch.randn(2, 3, size, size), device_name="h100", batch_size=64)
    assert len(plan.capture()) == 1 and plan.example_inputs[0].shape[0] == 64
    assert len(plan.sweep(3).points) >= 2
