"""Shared test settings: one CPU thread (stable, and fair on a 2-core machine), GPU tests
skipped without CUDA, and tests marked `slow` run after all the others."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    torch.set_num_threads(1)
    yield


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests without CUDA; move `slow` tests to the end, keeping each group's
    order (a stable sort), so a failure in a quick test shows before the long models run."""
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
    items.sort(key=lambda item: "slow" in item.keywords)
