"""Shared test settings: one CPU thread (stable, and fair on a 2-core machine), whole steps
timed in their least rounds, GPU tests skipped without CUDA, tests marked `slow` run after
all the others, every test starting with the session's Ctrl+C handler, and `quick_search` for tests
about exactness rather than the solver's quality."""

from __future__ import annotations

import signal

import pytest
import torch

from explorer.solvers.registry import SEARCH_SECONDS
from explorer.timingrounds import TIMING_SECONDS_VARIABLE

QUICK_SEARCH_TOTAL = 4.0  # CBC seconds a quick_search sweep refines with, all budgets together


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _least_timing_rounds(monkeypatch):
    """Whole steps timed in their least rounds (the profile's one, verify's three) rather
    than in the 4 s a user's profile and verify spend on a short step
    (explorer.timingrounds): tests assert what schedules do and what they hold, not how
    steady a clock is, and every profile and verify of the suite would pay those seconds.
    Through the environment, so the command lines a test starts get it too; the tests of the
    rounds themselves set it again."""
    monkeypatch.setenv(TIMING_SECONDS_VARIABLE, "0")


@pytest.fixture(autouse=True)
def _sigint_handler_kept():
    """Every test starts with the Ctrl+C handler the session found, and one that leaves the
    CLI's own handler installed fails: main() must put back what it found. Other changes are
    undone quietly; a suite run as a background job starts with SIGINT ignored, and the
    notebook test leaves Python's default handler there (which library in it does, untraced)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        if getattr(after, "__module__", "").startswith("explorer"):
            pytest.fail(f"the test left the CLI's SIGINT handler installed: {after!r}")


@pytest.fixture
def quick_search(monkeypatch):
    """The default solver with QUICK_SEARCH_TOTAL seconds of refinement per graph instead of
    explorer.solve.REFINE_TOTAL (45 s, which every sweep of a large step spends), through
    the environment (explorer.solvers.registry.SEARCH_SECONDS), so that the command lines and
    examples a test starts get it too. Its schedules come from the same table and the same
    refinement, less polished: for tests that verify what a schedule does, not how good it
    is (tests/test_solver_quality.py)."""
    monkeypatch.setenv(SEARCH_SECONDS, str(QUICK_SEARCH_TOTAL))


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches emptied before the test, as PyTorch's own tests do: every PassBlock
    (tests/helpers.py) a test builds and compiles adds entries for the one forward they all
    share, and a worker that ran the tests building them reached Dynamo's recompile limit
    (64), which the runtime makes an error (explorer.backend.dynamo_settings). For the tests
    that build them."""
    torch._dynamo.reset()


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests without CUDA; move `slow` tests to the end, keeping each group's
    order (a stable sort), so a failure in a quick test shows before the long models run."""
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
    items.sort(key=lambda item: "slow" in item.keywords)
