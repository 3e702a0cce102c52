"""An exported schedule needs only torch: in a process where PuLP, numpy, torchvision and
transformers cannot be imported, the file imports, wraps the model and trains it exactly."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch
from helpers import import_schedule

import explorer

MODEL = """
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4)
    ).train()
"""


def test_exported_file_runs_with_torch_alone(tmp_path):
    (tmp_path / "mlp_model.py").write_text(MODEL)  # one model source for both processes
    model = import_schedule(tmp_path / "mlp_model.py").build()
    x = torch.randn(256, 16)
    plan = explorer.Planner(model, x)
    schedule = plan.sweep(points=3).points[0].schedule
    assert schedule.recomputed_ops()
    schedule.export(tmp_path / "mlp_low.py")
    torch.save(x, tmp_path / "x.pt")
    script = textwrap.dedent(
        """
        import sys
        for name in ("pulp", "numpy", "torchvision", "transformers"):
            sys.modules[name] = None  # importing them now raises ImportError
        import copy, torch
        import mlp_low, mlp_model
        reference = mlp_model.build()
        wrapped = mlp_low.wrap(copy.deepcopy(reference))
        x = torch.load("x.pt")
        for model in (reference, wrapped):
            model(x).square().sum().backward()
        same = all(torch.equal(p.grad, q.grad)
                   for p, q in zip(reference.parameters(), wrapped.model.parameters()))
        loaded = sorted(m for m in sys.modules if m.startswith("explorer"))
        print(same, [p.how for p in wrapped.plans], loaded)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("True ['exact']"), result.stdout + result.stderr
    assert "explorer.solve" not in result.stdout and "explorer.planner" not in result.stdout
