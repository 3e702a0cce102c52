"""Benchmark: models from torchvision, timm and transformers that the tests do not plan.

    python bench/coverage.py [--only NAME ...] [--results bench/results]

Each model, built from a small configuration (no weights downloaded), is planned on this
machine's CPU (a 4-point sweep with REMAT_EXPLORER_SEARCH_SECONDS=4 unless set), its lowest
point verified (`Schedule.verify`: outputs, gradients, buffers, peak; its peak given as a
share of the activations, the no-recompute peak less the bytes no schedule changes), and then
trained for three AdamW steps (weight decay 0.01) beside the unmodified model, the loss
reading the model's first output only (a loss that leaves some outputs unread, as GoogLeNet's
logits leave its auxiliary heads), and beside the model under the runtime with nothing
recomputed: how far apart their parameters end (a compiled step's own arithmetic may differ
from eager's; recomputation changes no bit of the compiled step's). A
model whose peak recomputation cannot lower (its parameters and their gradients are the
peak) has one point and nothing to verify beyond no recomputation. One thread. Writes
coverage.json into --results.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import explorer
from explorer.backend import wrap_with_schedule

RESULTS = Path(__file__).parent / "results"
SEARCH_SECONDS = "4"  # the sweep's refinement per graph, unless the environment says

Made = tuple[torch.nn.Module, tuple, dict]


def _vision(name: str, size: int, batch: int = 2, **options: Any) -> Callable[[], Made]:
    def make() -> Made:
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, **options)
        return model, (torch.randn(batch, 3, size, size),), {}

    return make


def _deeplab() -> Made:
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

    model = deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=3)
    return model, (torch.randn(2, 3, 64, 64),), {}


def _timm(name: str, size: int, batch: int = 2, **options: Any) -> Callable[[], Made]:
    def make() -> Made:
        import timm

        model = timm.create_model(name, pretrained=False, num_classes=10, **options)
        return model, (torch.randn(batch, 3, size, size),), {}

    return make


def _hf(config: str, model: str, inputs: Callable[[], dict], **options: Any) -> Callable[[], Made]:
    def make() -> Made:
        import transformers

        made = getattr(transformers, model)(getattr(transformers, config)(**options))
        return made, (), inputs()

    return make


def _tokens(vocab: int, batch: int = 2, length: int = 16) -> Callable[[], dict]:
    def inputs() -> dict:
        return {
            "input_ids": torch.randint(0, vocab, (batch, length)),
            "labels": torch.randint(0, vocab, (batch, length)),
        }

    return inputs


_SMALL_TEXT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2}
_SMALL_ATTENTION = {**_SMALL_TEXT, "num_attention_heads": 2, "intermediate_size": 64}
_SEQ2SEQ = {
    "vocab_size": 100,
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
}

MODELS: dict[str, Callable[[], Made]] = {
    "torchvision googlenet (aux heads) b2 64": _vision(
        "googlenet", 64, aux_logits=True, init_weights=True
    ),
    "torchvision densenet121 b2 32": _vision("densenet121", 32),
    "torchvision regnet_y_400mf b2 32": _vision("regnet_y_400mf", 32),
    "torchvision shufflenet_v2_x0_5 b2 32": _vision("shufflenet_v2_x0_5", 32),
    "torchvision squeezenet1_1 b2 64": _vision("squeezenet1_1", 64),
    "torchvision mnasnet0_5 b2 32": _vision("mnasnet0_5", 32),
    "torchvision swin_t b2 64": _vision("swin_t", 64),
    "torchvision convnext_tiny b2 32": _vision("convnext_tiny", 32, stochastic_depth_prob=0.1),
    "torchvision deeplabv3_mobilenet_v3_large b2 64": _deeplab,
    "timm convnext_atto b2 64": _timm("convnext_atto", 64, drop_path_rate=0.1),
    "timm mobilevit_xxs b2 64": _timm("mobilevit_xxs", 64),
    "timm resnet18d b2 64": _timm("resnet18d", 64, drop_path_rate=0.1),
    "timm levit_128s b2 64": _timm("levit_128s", 64, img_size=64),
    "timm coatnet_nano_rw_224 b2 64": _timm("coatnet_nano_rw_224", 64, img_size=64),
    "timm vit_tiny_patch16_224 (2 blocks) b32 64": _timm(
        "vit_tiny_patch16_224", 64, 32, img_size=64, depth=2, drop_path_rate=0.1
    ),
    "transformers DistilBERT": _hf(
        "DistilBertConfig",
        "DistilBertForSequenceClassification",
        lambda: {"input_ids": torch.randint(0, 100, (2, 16)), "labels": torch.tensor([0, 1])},
        vocab_size=100,
        dim=32,
        n_layers=2,
        n_heads=2,
        hidden_dim=64,
        max_position_embeddings=32,
    ),
    "transformers ViT": _hf(
        "ViTConfig",
        "ViTForImageClassification",
        lambda: {"pixel_values": torch.randn(2, 3, 32, 32), "labels": torch.tensor([0, 1])},
        image_size=32,
        patch_size=8,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_labels=3,
    ),
    "transformers BART": _hf(
        "BartConfig",
        "BartForConditionalGeneration",
        lambda: {
            "input_ids": torch.randint(0, 100, (4, 64)),
            "labels": torch.randint(0, 100, (4, 48)),
        },
        max_position_embeddings=80,
        **_SEQ2SEQ,
    ),
    "transformers Whisper": _hf(
        "WhisperConfig",
        "WhisperForConditionalGeneration",
        lambda: {"input_features": torch.randn(2, 16, 32), "labels": torch.randint(0, 100, (2, 6))},
        num_mel_bins=16,
        max_source_positions=16,
        max_target_positions=16,
        decoder_start_token_id=1,
        pad_token_id=0,
        **_SEQ2SEQ,
    ),
    "transformers DeBERTa-v2": _hf(
        "DebertaV2Config",
        "DebertaV2ForMaskedLM",
        _tokens(100),
        max_position_embeddings=32,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        **_SMALL_ATTENTION,
    ),
    "transformers Mixtral (4 experts)": _hf(
        "MixtralConfig",
        "MixtralForCausalLM",
        _tokens(100),
        num_key_value_heads=1,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=32,
        **_SMALL_ATTENTION,
    ),
    "transformers Mamba": _hf(
        "MambaConfig",
        "MambaForCausalLM",
        _tokens(100),
        state_size=8,
        use_cache=False,
        **_SMALL_TEXT,
    ),
    "transformers Falcon": _hf(
        "FalconConfig",
        "FalconForCausalLM",
        _tokens(100),
        num_attention_heads=2,
        use_cache=False,
        **_SMALL_TEXT,
    ),
    "transformers ELECTRA": _hf(
        "ElectraConfig",
        "ElectraForPreTraining",
        lambda: {
            "input_ids": torch.randint(0, 100, (2, 16)),
            "labels": torch.randint(0, 2, (2, 16)),
        },
        embedding_size=16,
        max_position_embeddings=32,
        **_SMALL_ATTENTION,
    ),
}


def _first_output_loss(out: Any) -> torch.Tensor:
    """The loss of the training loop: the model's own loss where it returns one, else the
    mean square of its first output (or its logits)."""
    if getattr(out, "loss", None) is not None:
        return out.loss
    if isinstance(out, dict):
        out = out["out"]
    out = getattr(out, "logits", out)
    if isinstance(out, (tuple, list)):
        out = out[0]
    return out.float().square().mean()


def _trained(models: list[torch.nn.Module], args, kwargs) -> list[list[torch.Tensor]]:
    """Three AdamW steps of each model from the same state and seeds: their parameters."""
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
    for step in range(3):
        for run, optimizer in zip(models, optimizers, strict=True):
            torch.manual_seed(step)
            optimizer.zero_grad(set_to_none=True)
            _first_output_loss(run(*args, **kwargs)).backward()
            optimizer.step()
    return [list(m.parameters()) for m in models]


def _apart(first: list[torch.Tensor], second: list[torch.Tensor]) -> float:
    """The largest difference between two lists of parameters (0.0: bitwise equal)."""
    return max((a - b).abs().max().item() for a, b in zip(first, second, strict=True))


def _measure(name: str, make: Callable[[], Made]) -> dict:
    start = time.perf_counter()
    torch.manual_seed(0)
    torch._dynamo.reset()
    model, args, kwargs = make()
    plan = explorer.Planner(model, args, kwargs)
    graphs = len(plan.capture())
    front = plan.sweep(points=4)
    lowest = front.points[0]
    report = lowest.schedule.verify()
    rows = {row.quantity: row for row in report.rows}
    wrapped, plain = (
        wrap_with_schedule(copy.deepcopy(model), plan.made_for(), schedule.to_dict())
        for schedule in (lowest.schedule, plan.baseline())
    )
    eager, planned, compiled = _trained([copy.deepcopy(model), wrapped, plain], args, kwargs)
    return {
        "model": name,
        "graphs": graphs,
        "points": len(front.points),
        "lowest_bytes": lowest.predicted_peak_bytes,
        "no_recompute_bytes": front.baseline_peak_bytes,
        "fixed_bytes": front.fixed_bytes,
        "recomputed": len(lowest.schedule.recomputed_ops()),
        "verified": report.ok,
        "outputs": rows["outputs"].measured,
        "gradients": rows["parameter gradients"].measured,
        "trained_apart": _apart(eager, planned),
        "trained_apart_from_no_recompute": _apart(compiled, planned),
        "seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="*", help="models whose name contains one of these")
    parser.add_argument("--results", type=Path, default=RESULTS)
    options = parser.parse_args()
    os.environ.setdefault("REMAT_EXPLORER_SEARCH_SECONDS", SEARCH_SECONDS)
    torch.set_num_threads(1)
    chosen = [
        (name, make)
        for name, make in MODELS.items()
        if not options.only or any(part in name for part in options.only)
    ]
    print(
        "| model | graphs | points | lowest point | verify | 3 AdamW steps: from eager | "
        "from no recomputation |"
    )
    print("|---|---:|---:|---|---|---|---|")
    rows = []
    for name, make in chosen:
        try:
            row = _measure(name, make)
        except Exception as exc:  # a model that fails is a row, not the end of the run
            row = {"model": name, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            traceback.print_exc()
        rows.append(row)
        if "error" in row:
            print(f"| {name} | | | | {row['error']} | | |", flush=True)
            continue
        fixed = row["fixed_bytes"]
        share = (row["lowest_bytes"] - fixed) / max(1, row["no_recompute_bytes"] - fixed)
        verdict = "passed" if row["verified"] else "FAILED"
        gradients = row["gradients"].replace("|", "\\|")  # "max |diff| ..." in a table
        trained = " | ".join(
            "bitwise equal" if row[key] == 0 else f"{row[key]:.2g}"
            for key in ("trained_apart", "trained_apart_from_no_recompute")
        )
        print(
            f"| {name} | {row['graphs']} | {row['points']} | {share:.2f} of the activations, "
            f"{row['recomputed']} recomputed | {verdict} ({gradients}) | {trained} |",
            flush=True,
        )
    options.results.mkdir(parents=True, exist_ok=True)
    (options.results / "coverage.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
