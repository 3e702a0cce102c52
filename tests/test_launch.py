"""`remat-explorer app`'s launcher: what it refuses before Voila starts, what it hands on."""

from __future__ import annotations

import subprocess
import sys

import pytest

from explorer.cli import main
from explorer.errors import UserError
from explorer.models import build
from remat_explorer.apps import launch


@pytest.fixture
def no_voila(monkeypatch):
    """Starting Voila would be a failure here: every case must be refused before."""

    def popen(*args, **kwargs):
        raise AssertionError("Voila was started")

    monkeypatch.setattr(subprocess, "Popen", popen)


@pytest.mark.parametrize(("batch", "size"), [(0, None), (-3, None), (8, 0), (8, -1)])
def test_serve_refuses_sizes_below_one(no_voila, batch, size):
    # catches: `batch_size or DEFAULT` turning 0 into 8, and -3 passed on to the page
    with pytest.raises(UserError, match="at least 1"):
        launch.serve(None, "sample:tiny_cnn", batch, size)


@pytest.mark.parametrize("batch", ["0", "-3", "2.5"])
def test_app_command_refuses_a_bad_batch_size(no_voila, capsys, batch):
    assert main(["app", "--batch-size", batch]) == 2
    assert "--batch-size" in capsys.readouterr().err


def test_the_page_gets_the_values_asked_for():
    # catches: a large batch replaced by another value on its way to the dashboard
    environ = launch.environment("sample:tiny_cnn", 2_000_000, 48, export_dir=".")
    settings = launch.from_environment(environ)
    assert (settings["spec"], settings["batch_size"], settings["input_size"]) == (
        "sample:tiny_cnn", 2_000_000, 48
    )  # fmt: skip
    assert launch.from_environment({})["batch_size"] == launch.DEFAULT_BATCH_SIZE
    with pytest.raises(UserError, match="whole number"):
        launch.from_environment({launch.ENV_BATCH_SIZE: "lots"})


def test_the_page_finds_a_factory_module_where_the_app_was_started(monkeypatch, tmp_path):
    # catches: the kernel, which runs in the notebook's folder, unable to import a factory
    # module beside the user ("cannot import 'remat_app_factories'")
    started, notebook = tmp_path / "started", tmp_path / "notebook"
    started.mkdir()
    notebook.mkdir()
    (started / "remat_app_factories.py").write_text(
        "import torch\nfrom torch import nn\n\n"
        "def mlp():\n    return nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4)\n"
    )
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(started))])
    monkeypatch.chdir(notebook)
    environ = launch.environment("remat_app_factories:mlp", 2, None, export_dir=started)
    settings = launch.from_environment(environ)
    built = build(settings["spec"], settings["batch_size"], settings["input_size"])
    assert built.example_inputs[0].shape == (2, 4)
