"""Choose what to plan: a model SPEC (searchable), batch size, input size, device (this
machine's, or a device planned for with the cost model: nothing runs), precision (fp32, or the
step under autocast: a plan of its own), what the backward starts from (a gradient for every
output, or a named loss of the output, explorer.losses) and whether each step starts with the
gradients of the one before (gradient accumulation)."""

from __future__ import annotations

import ipywidgets as ipw
import torch

from explorer import UserError, models
from explorer.devices import device_names

PLAN_FOR = "plan for "  # a device choice that plans with predicted times on the meta device

PRECISIONS = {"fp32": None, "bf16 autocast": torch.bfloat16, "fp16 autocast": torch.float16}
LOSSES = {"gradient per output": None, "cross-entropy loss": "cross_entropy"}


def available_devices() -> list[str]:
    """'cuda' first when this machine has one, so the default is the GPU."""
    return ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]


def planned_devices() -> list[str]:
    """The devices a step can be planned for without running it (explorer.costmodel)."""
    return [f"{PLAN_FOR}{name}" for name in device_names()]


class ModelPicker(ipw.HBox):
    """Model SPEC, batch size, input size, device, precision, the backward's start and
    gradient accumulation (class `remat-model`).

    The SPEC box is a combobox over `explorer.models.list_specs()`: typing filters the list.
    An empty input size means the model's own default example input.
    """

    def __init__(
        self,
        spec: str | None = None,
        batch_size: int = 8,
        input_size: int | None = None,
        device: str | None = None,
    ) -> None:
        devices = available_devices()
        self.spec = ipw.Combobox(
            options=models.list_specs(),
            value=spec or "",
            placeholder="type to search: resnet18, sample:unet, ...",
            description="model",
            ensure_option=False,
        )
        _check_batch_size(batch_size)
        # not a BoundedIntText: it would silently replace 0 or a large batch by its bounds
        self.batch_size = ipw.IntText(
            value=batch_size, description="batch", layout={"width": "140px"}
        )
        self.input_size = ipw.Text(
            value="" if input_size is None else str(input_size),
            placeholder="default",
            description="input size",
            layout={"width": "180px"},
        )
        self.device = ipw.Dropdown(
            options=[*devices, *planned_devices()],
            value=device or devices[0],
            description="device",
            layout={"width": "210px"},
        )
        self.precision = ipw.Dropdown(
            options=list(PRECISIONS),
            value="fp32",
            description="precision",
            layout={"width": "220px"},
        )
        self.loss = ipw.Dropdown(
            options=list(LOSSES),
            value="gradient per output",
            description="backward from",
            style={"description_width": "initial"},  # the default width cuts the label
            layout={"width": "300px"},
        )
        self.accumulate = ipw.Checkbox(
            value=False, description="gradients held (accumulation)", indent=False
        )
        fields = [self.spec, self.batch_size, self.input_size, self.device, self.precision]
        super().__init__([*fields, self.loss, self.accumulate], layout={"flex_flow": "row wrap"})
        self.add_class("remat-model")

    def plan_for(self) -> str | None:
        """The cost model's device name when the step is planned for a device without being
        run ("p100", ..., "cpu"), else None."""
        chosen = self.device.value
        return chosen[len(PLAN_FOR) :] if chosen.startswith(PLAN_FOR) else None

    def autocast(self) -> torch.dtype | None:
        """The autocast dtype to plan under, or None for plain fp32."""
        return PRECISIONS[self.precision.value]

    def step_options(self) -> dict:
        """What the planned step is beyond the model, as Planner's keywords."""
        return {
            "autocast": self.autocast(),
            "loss": LOSSES[self.loss.value],
            "gradients_held": self.accumulate.value,
        }

    def backward_key(self) -> tuple:
        """The choices about the backward, to tell when they changed (a new plan; the
        precision is among `settings()`)."""
        return (self.loss.value, self.accumulate.value)

    def settings(self) -> tuple[str, int, int | None, str, str]:
        """(spec, batch size, input size or None, device, precision), checked enough to build
        from."""
        spec = self.spec.value.strip()
        if not spec:
            raise UserError("choose a model first (type in the model box to search)")
        size_text = self.input_size.value.strip()
        if size_text and not (size_text.isdigit() and int(size_text) > 0):
            raise UserError(f"input size must be a positive whole number, not {size_text!r}")
        _check_batch_size(self.batch_size.value)
        size = int(size_text) if size_text else None
        return spec, self.batch_size.value, size, self.device.value, self.precision.value

    def build(self) -> models.Built:
        """Build the chosen model and its example input on the chosen device."""
        spec, batch_size, input_size, device, _precision = self.settings()
        return models.build(spec, batch_size, input_size, device=device)

    def lock(self, label: str, device: str, batch_size: int | None) -> None:
        """Show a model the caller passed in instead of a choice. It runs on `device` at its
        inputs' `batch_size` (None: they have no batch dimension); the device field offers
        that device and the ones it can be planned for, at any batch (nothing runs)."""
        self.spec.value = label
        self.spec.disabled = True
        self.input_size.layout.display = "none"  # which of its dimensions is a size is unknown
        self.device.options = [device, *planned_devices()]
        self.device.value = device
        if batch_size is None:
            self.batch_size.layout.display = "none"
        else:
            self.batch_size.value = batch_size


def _check_batch_size(batch_size: object) -> None:
    """A batch is a whole number of at least 1; whether it fits is for `models.build`."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise UserError(f"batch size must be a whole number of at least 1, not {batch_size!r}")
