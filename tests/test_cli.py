"""The command line, as docs/DESIGN.md's contract states it, and its answers to bad input.

Each test of bad input also checks that nothing was written (docs/RELIABILITY.md lists them).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICK_SEARCH_TOTAL
from helpers import planner

from explorer import sweep
from explorer.cli import build_parser, main
from explorer.errors import UserError
from explorer.solvers.registry import SEARCH_SECONDS
from explorer.timingrounds import TIMING_SECONDS_VARIABLE
from explorer.units import format_bytes, format_seconds, least_fraction, parse_budget

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    """This checkout first on the path, whatever the current folder (tests run some in tmp)."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def cli(
    *args: str, cwd: Path | None = None, umask: int | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "explorer.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**_env(), **(env or {})},
        timeout=900,
        preexec_fn=None if umask is None else (lambda: os.umask(umask)),
    )


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture(scope="module")
def swept(tmp_path_factory) -> Path:
    """resnet18's front from the command line, refined as quick_search's (tests/conftest.py):
    the tests that read it are about the files and the command line, not the front's quality."""
    out = tmp_path_factory.mktemp("sweep")
    result = cli(
        "sweep",
        "--model",
        "resnet18",
        "--batch-size",
        "16",
        "--input-size",
        "96",
        "--device",
        "cpu",
        "--points",
        "8",
        "--out",
        str(out),
        env={SEARCH_SECONDS: str(QUICK_SEARCH_TOTAL)},
    )
    assert result.returncode == 0, result.stderr
    assert "predicted peak" in result.stdout
    return out


def test_sweep_writes_a_monotone_front(swept):
    assert (swept / "profile.json").exists()
    front = json.loads((swept / "front.json").read_text())
    assert front["schema"] == 2 and front["fingerprint"]
    assert front["baseline"]["peak_bytes"] > 0 and front["baseline"]["step_seconds"] > 0
    points = front["points"]
    assert len(points) >= 2
    peaks = [p["predicted_peak_bytes"] for p in points]
    overheads = [p["predicted_overhead"] for p in points]
    assert peaks == sorted(peaks) and len(set(peaks)) == len(peaks)
    assert overheads == sorted(overheads, reverse=True)
    for p in points:
        assert p["predicted_peak_bytes"] <= p["budget_bytes"]
        assert p["status"] in ("optimal", "feasible") and p["gap"] >= 0
        assert p["solve_seconds"] >= 0


def test_export_and_verify_at_0_6(swept, tmp_path):
    target = tmp_path / "r18_06.py"
    result = cli(
        "export", "--front", str(swept / "front.json"), "--budget", "0.6", "--out", str(target)
    )
    assert result.returncode == 0, result.stderr
    result = cli("verify", str(target), "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["ok"]


def test_models_lists_specs():
    result = cli("models")
    assert result.returncode == 0
    names = result.stdout.split()
    assert "resnet50" in names and "sample:unet" in names and "sample:gpt" in names


def test_unknown_model(tmp_path):
    result = cli("sweep", "--model", "resnt18", "--batch-size", "2", "--out", str(tmp_path / "o"))
    assert_one_line_error(result, "resnt18", "resnet18")
    assert not (tmp_path / "o").exists()


def test_budget_below_minimum_names_it(swept, tmp_path):
    target = tmp_path / "tiny.py"
    result = cli(
        "export", "--front", str(swept / "front.json"), "--budget", "1MiB", "--out", str(target)
    )
    lowest = min(
        p["predicted_peak_bytes"] for p in json.loads((swept / "front.json").read_text())["points"]
    )
    assert_one_line_error(result, "minimum", str(lowest))
    assert not target.exists()


@pytest.mark.parametrize("content", ["{not json", "[]", '{"schema": 1, "points": "x"}'])
def test_corrupt_front(tmp_path, content):
    front = tmp_path / "front.json"
    front.write_text(content)
    result = cli(
        "export", "--front", str(front), "--budget", "0.5", "--out", str(tmp_path / "x.py")
    )
    assert_one_line_error(result, "front")
    assert not (tmp_path / "x.py").exists()


def test_mismatched_front(swept, tmp_path):
    data = json.loads((swept / "front.json").read_text())
    data["fingerprint"] = "0" * 16
    front = tmp_path / "front.json"
    front.write_text(json.dumps(data))
    result = cli(
        "export", "--front", str(front), "--budget", "0.9", "--out", str(tmp_path / "x.py")
    )
    assert_one_line_error(result, "another graph")


def test_corrupt_or_mismatched_profile_is_refused_not_overwritten(swept, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "profile.json").write_text("garbage")
    result = cli(
        "sweep", "--model", "resnet18", "--batch-size", "4", "--input-size", "32", "--out", str(out)
    )
    how = f"to profile this step, give --out another folder or delete {out / 'profile.json'}"
    assert_one_line_error(result, "profile", how)
    assert (out / "profile.json").read_text() == "garbage"
    (out / "profile.json").write_text((swept / "profile.json").read_text())  # another shape
    result = cli(
        "sweep", "--model", "resnet18", "--batch-size", "4", "--input-size", "32", "--out", str(out)
    )
    # catches: a refusal that names neither step nor what to do (it said "profile this model
    # again", which the same command then refused again)
    this = "than this one (resnet18, batch 4, input 32)"
    assert_one_line_error(result, "was profiled for another step", this, how)
    assert not (out / "front.json").exists()
    (out / "front.json").write_text((swept / "front.json").read_text())  # the front beside it
    result = cli(
        "sweep", "--model", "resnet18", "--batch-size", "4", "--input-size", "32", "--out", str(out)
    )
    assert_one_line_error(result, "for another step (resnet18, batch 16, input 96) " + this, how)
    assert (out / "front.json").read_text() == (swept / "front.json").read_text()


def _export(swept: Path, tmp_path: Path) -> Path:
    target = tmp_path / "r18.py"
    assert (
        cli(
            "export", "--front", str(swept / "front.json"), "--budget", "0.8", "--out", str(target)
        ).returncode
        == 0
    )
    return target


def test_exported_file_with_another_model(swept, tmp_path):
    target = _export(swept, tmp_path)
    target.write_text(target.read_text().replace("'name': 'resnet18'", "'name': 'resnet34'"))
    assert_one_line_error(cli("verify", str(target)), "made for")


def test_exported_file_with_another_shape(swept, tmp_path):
    target = _export(swept, tmp_path)
    target.write_text(target.read_text().replace("'input_size': 96", "'input_size': 64"))
    assert_one_line_error(cli("verify", str(target)), "made for another graph")


def test_corrupt_exported_file(tmp_path):
    target = tmp_path / "broken.py"
    target.write_text("MADE_FOR = {'model': \nSCHEDULE = ")
    assert_one_line_error(cli("verify", str(target)), "corrupt")


def test_bad_budget_text(swept, tmp_path):
    result = cli(
        "export",
        "--front",
        str(swept / "front.json"),
        "--budget",
        "lots",
        "--out",
        str(tmp_path / "x.py"),
    )
    assert_one_line_error(result, "budget")


def test_usage_error_is_one_line():
    assert_one_line_error(cli("sweep", "--model", "resnet18"), "required")


# ---------------------------------------------------------------- files and errors (issue 9)
# In-process through main() where the process boundary does not matter (starting Python and
# torch costs seconds per call on a busy 2-core machine); subprocesses for Ctrl+C and pipes.


def run(capsys, *args: str) -> tuple[int, list[str]]:
    """main(args) in this process: its exit code and its non-empty stderr lines."""
    code = main(list(args))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


def assert_refused(capsys, args: list[str], *fragments: str) -> None:
    code, err = run(capsys, *args)
    assert code == 2 and len(err) == 1, err
    assert "Traceback" not in err[0] and "internal error" not in err[0]
    for fragment in fragments:
        assert fragment in err[0], err[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A front of sample:tiny_cnn (a second to make): for the tests that only need a front."""
    out = tmp_path_factory.mktemp("tiny")
    args = ["sweep", "--model", "sample:tiny_cnn", "--batch-size", "8", "--input-size", "32"]
    assert main([*args, "--points", "4", "--out", str(out)]) == 0
    return out / "front.json"


def export_args(front: Path, out: Path, *extra: str, budget: str = "1.0") -> list[str]:
    return ["export", "--front", str(front), "--budget", budget, "--out", str(out), *extra]


def test_export_replaces_only_a_schedule_unless_forced(capsys, tiny, tmp_path):
    # catches: export silently replacing a user's own .py (it did: `--out train.py`)
    script = tmp_path / "train.py"
    script.write_text("print('my training loop')\n")
    assert_refused(capsys, export_args(tiny, script), "not a schedule", "--force")
    assert script.read_text() == "print('my training loop')\n"
    assert run(capsys, *export_args(tiny, script, "--force"))[0] == 0
    assert "def wrap(" in script.read_text()
    # a schedule it wrote itself may be replaced: exporting again is the normal workflow
    assert run(capsys, *export_args(tiny, script, budget="0.95"))[0] == 0


@pytest.mark.parametrize("name", ["torch", "sys", "numpy", "json"])
def test_export_refuses_a_name_that_shadows_a_module(capsys, tiny, tmp_path, name):
    # catches: dropping the stdlib / ecosystem name check (a torch.py beside a training
    # script breaks `import torch`, and with it remat-explorer itself)
    target = tmp_path / f"{name}.py"
    assert_refused(capsys, export_args(tiny, target), f"import {name}")
    assert not target.exists()


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_follow_the_umask(capsys, tmp_path, tiny, umask):
    # catches: files left with mkstemp's 0600 (unreadable for a group that shares a run)
    target, out = tmp_path / "follows.py", tmp_path / "run"
    previous = os.umask(umask)
    try:
        assert run(capsys, *export_args(tiny, target))[0] == 0
        profile = ["profile", "--model", "sample:tiny_mlp", "--batch-size", "2", "--out", str(out)]
        assert run(capsys, *profile)[0] == 0
    finally:
        os.umask(previous)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((out / "profile.json").stat().st_mode) == 0o666 & ~umask


FACTORIES = """
import sys

import torch
from torch import nn

def raises():
    raise RuntimeError("factory bug")

exits = sys.exit

def with_inputs():
    return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2)), torch.randn(3, 5)
"""


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("remat_cli_factories:raises", "raised RuntimeError: factory bug"),
        ("sys:exit", "SystemExit"),  # it exited 0, having done nothing
        ("remat_cli_factories:exits", "SystemExit"),
        ("no_such_module_here:f", "cannot import"),
    ],
)
def test_a_factory_that_fails_is_bad_input(capsys, monkeypatch, tmp_path, spec, expected):
    # catches: the factory's exception or SystemExit escaping as exit 3 or exit 0
    (tmp_path / "remat_cli_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    assert_refused(
        capsys, ["profile", "--model", spec, "--batch-size", "2", "--out", str(out)], expected
    )
    assert not out.exists()


def test_a_factory_with_its_own_inputs_needs_no_batch_size(capsys, monkeypatch, tmp_path):
    # catches: --batch-size required for every model, or the front recording a number the
    # step was not traced with (the factory's inputs are batch 3)
    (tmp_path / "remat_cli_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "out"
    spec = ["--model", "remat_cli_factories:with_inputs"]
    code, err = run(capsys, "sweep", *spec, "--points", "2", "--device", "cpu", "--out", str(out))
    assert code == 0, err
    assert json.loads((out / "front.json").read_text())["model"]["model"]["batch_size"] == 3
    again = tmp_path / "again"
    args = ["profile", *spec, "--batch-size", "8", "--out", str(again)]
    assert_refused(capsys, args, "batch 3, not --batch-size 8")
    assert not again.exists()


def test_a_small_step_is_timed_in_milliseconds(capsys, tmp_path):
    # catches: "0.000 s per step" for a step of a fraction of a millisecond
    assert [format_seconds(s) for s in (0.000214, 0.0123, 1.2345, 2500.4)] == [
        "0.214 ms",
        "12.3 ms",
        "1.23 s",
        "2500 s",
    ]
    args = ["profile", "--model", "sample:tiny_mlp", "--batch-size", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert " ms per step" in printed and "0.000 s" not in printed, printed


def test_a_profile_from_before_the_moments_is_used_with_a_one_line_warning(tmp_path):
    # catches: an older profile.json (no "eager" per graph) planned as if code outside the
    # graphs held nothing, without a word; or the warning printed as Python's two lines
    args = ["profile", "--model", "sample:tiny_mlp", "--batch-size", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    path = tmp_path / "profile.json"
    older = json.loads(path.read_text())
    for graph in older["graphs"]:
        del graph["eager"]
    path.write_text(json.dumps(older))
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    warned = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warned) == 1 and warned[0].startswith("remat-explorer: warning: "), result.stderr
    assert "profile again" in warned[0] and "RematWarning" not in result.stderr
    assert json.loads(path.read_text()) == older  # reused, not rewritten


def _export_and_verify_to_the_byte(out: Path, budget: str) -> None:
    """Export OUT/front.json's point within `budget`, then verify it from the command line:
    it passes, and the measured peak is the predicted one."""
    target = out / "point.py"
    exported = cli("export", "--front", str(out / "front.json"), "--budget", budget,
                   "--out", str(target))  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    verified = cli("verify", str(target), "--json")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    peak = next(r for r in json.loads(verified.stdout)["rows"] if r["quantity"].startswith("peak"))
    assert peak["measured"] == peak["predicted"]


def test_a_sweep_for_gradient_accumulation_exports_and_verifies(tmp_path, quick_search):
    # catches: --gradients-held lost between the sweep, the exported file and verify (which
    # then measures a step without them against a prediction with them)
    args = ["--model", "sample:tiny_cnn", "--batch-size", "2", "--input-size", "16"]
    swept = cli("sweep", *args, "--points", "3", "--gradients-held", "--out", str(tmp_path))
    assert swept.returncode == 0, swept.stderr
    front = json.loads((tmp_path / "front.json").read_text())
    assert front["model"]["gradients_held"] is True
    _export_and_verify_to_the_byte(tmp_path, "0.9")


def test_a_sweep_with_a_named_loss_exports_and_verifies(tmp_path, quick_search):
    # catches: --loss lost between the sweep, the exported file and the command line's
    # verify (which cannot be handed a Python loss, so it rebuilds the named one); a profile
    # measured with the loss reused for a step without it
    args = ["--model", "sample:gpt", "--batch-size", "2", "--input-size", "32"]
    swept = cli("sweep", *args, "--points", "3", "--loss", "cross_entropy", "--out", str(tmp_path))
    assert swept.returncode == 0, swept.stderr
    front = json.loads((tmp_path / "front.json").read_text())
    assert front["model"]["loss"] == "cross_entropy"
    assert json.loads((tmp_path / "profile.json").read_text())["loss"] == "cross_entropy"
    _export_and_verify_to_the_byte(tmp_path, "1.0")
    again = cli("sweep", *args, "--points", "3", "--out", str(tmp_path))  # without the loss
    assert_one_line_error(
        again,
        "profiled for another step (sample:gpt, batch 2, input 32, loss cross_entropy) than "
        "this one (sample:gpt, batch 2, input 32)",
    )


def test_the_loss_choices_are_the_named_losses():
    from explorer.losses import NAMED

    subcommands = next(a for a in build_parser()._actions if a.dest == "command")
    for command in ("profile", "sweep"):
        loss = next(a for a in subcommands.choices[command]._actions if a.dest == "loss")
        assert sorted(loss.choices) == sorted(NAMED)


def test_a_model_whose_input_is_made_here_needs_a_batch_size(capsys, tmp_path):
    # catches: a missing --batch-size reaching the model builder as None (an internal error)
    out = tmp_path / "out"
    args = ["profile", "--model", "sample:tiny_mlp", "--out", str(out)]
    assert_refused(capsys, args, "sample:tiny_mlp needs a batch size (--batch-size)")
    assert not out.exists()


@pytest.mark.parametrize(
    ("batch", "expected"),
    [("1e9", "whole number"), ("0", "at least 1"), ("-3", "at least 1"),
     ("1000000000000", "needs")],
)  # fmt: skip
def test_a_batch_size_that_is_not_a_count_or_cannot_be_allocated(capsys, tmp_path, batch, expected):
    # catches: `--batch-size 1e9` and batches too large to allocate ending as internal errors
    out = tmp_path / "out"
    args = ["profile", "--model", "sample:tiny_mlp", "--batch-size", batch, "--out", str(out)]
    assert_refused(capsys, args, expected)
    assert not out.exists()


def test_an_out_folder_that_is_a_file_is_refused_before_any_work(capsys, tmp_path, tiny):
    # catches: mkdir's FileExistsError / NotADirectoryError surfacing as an internal error
    a_file = tmp_path / "results"
    a_file.write_text("not a folder")
    for out in (a_file, a_file / "inside"):
        # refused before the (unknown) model is even looked up
        args = ["sweep", "--model", "no_such_model", "--batch-size", "2", "--out", str(out)]
        assert_refused(capsys, args, "is a file")
    assert_refused(capsys, export_args(tiny, a_file / "schedule.py"), "is a file")
    assert a_file.read_text() == "not a folder"
    a_folder = tmp_path / "d.py"
    a_folder.mkdir()
    assert_refused(capsys, export_args(tiny, a_folder), "is a folder")


def test_an_out_that_cannot_be_written(capsys, tmp_path, tiny):
    # catches: PermissionError / OSError from the write surfacing as an internal error
    assert_refused(capsys, export_args(tiny, Path("/proc/remat_explorer_test.py")), "cannot")
    if os.geteuid() != 0:  # root may write anywhere: only /proc is read-only for it
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        assert_refused(capsys, export_args(tiny, locked / "schedule.py"), "cannot be written")
        assert not list(locked.iterdir())


@pytest.mark.parametrize("bad", ["folder", "1e400", "NaN", "-Infinity"])
def test_a_front_that_is_a_folder_or_holds_a_non_finite_number(capsys, tmp_path, tiny, bad):
    # catches: json's float('inf') / NaN reaching int() (OverflowError: internal error), and
    # IsADirectoryError from reading a folder
    if bad == "folder":
        front = tmp_path
    else:
        front = tmp_path / "front.json"
        text = tiny.read_text()
        front.write_text(text.replace('"peak_bytes": ', f'"peak_bytes": {bad}, "was": ', 1))
        assert json.loads(front.read_text())["baseline"]["was"] > 0  # the baseline's peak
    target = tmp_path / "never.py"
    assert_refused(capsys, export_args(front, target), "folder" if bad == "folder" else bad)
    assert not target.exists()


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_time_limit_that_is_not_a_positive_number(capsys, tmp_path, value):
    # catches: a time limit handed to CBC unchecked (-1 ran for 10 s, 0 and nan ran at all)
    args = ["sweep", "--model", "sample:tiny_mlp", "--batch-size", "2", "--out", str(tmp_path)]
    assert_refused(capsys, [*args, f"--time-limit={value}"], "--time-limit")
    assert not list(tmp_path.iterdir())


def test_points_below_two_are_refused_before_any_work(capsys, tmp_path):
    args = ["sweep", "--model", "sample:tiny_mlp", "--batch-size", "2", "--out", str(tmp_path)]
    assert_refused(capsys, [*args, "--points", "1"], "at least 2 points")


def test_search_seconds_are_read_from_the_environment(monkeypatch):
    from explorer.solve import REFINE_TOTAL
    from explorer.solvers.registry import search_seconds

    monkeypatch.delenv(SEARCH_SECONDS, raising=False)
    assert search_seconds() == REFINE_TOTAL
    for text, seconds in [(" 12.5 ", 12.5), ("0", 0.0), ("", REFINE_TOTAL)]:
        monkeypatch.setenv(SEARCH_SECONDS, text)
        assert search_seconds() == seconds


@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_search_seconds_that_are_not_a_number_are_refused_before_any_work(
    capsys, monkeypatch, tmp_path, value
):
    # catches: a bad $REMAT_EXPLORER_SEARCH_SECONDS read only when the solver is made, after
    # the model was built and profiled (or taken as a time, -1 or inf, by CBC)
    monkeypatch.setenv(SEARCH_SECONDS, value)
    out = tmp_path / "out"
    args = ["sweep", "--model", "sample:tiny_mlp", "--batch-size", "2", "--out", str(out)]
    assert_refused(capsys, args, SEARCH_SECONDS, "0 or more")
    assert not out.exists()


@pytest.mark.parametrize("command", ["profile", "sweep", "verify"])
def test_timing_seconds_that_are_not_a_number_are_refused_before_any_work(
    capsys, monkeypatch, tmp_path, command
):
    # catches: a bad $REMAT_EXPLORER_TIMING_SECONDS read after the model was built, captured
    # and its operators timed, or taken as a time (-1: one round whatever the step)
    monkeypatch.setenv(TIMING_SECONDS_VARIABLE, "-1")
    built = []  # the model built: work done
    monkeypatch.setattr(sys.modules["explorer.cli"], "_planner", built.append)
    out = tmp_path / "out"
    model = ["--model", "sample:tiny_mlp", "--batch-size", "2", "--out", str(out)]
    args = [command, str(tmp_path / "none.py")] if command == "verify" else [command, *model]
    assert_refused(capsys, args, TIMING_SECONDS_VARIABLE, "0 or more")
    assert not out.exists() and not built
    plan = planner("sample:tiny_mlp", 2, None)
    with pytest.raises(UserError, match=TIMING_SECONDS_VARIABLE):
        plan.profile()
    assert plan._captured is None  # refused before the capture


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


_CALLS_BACK_FROM_C = """
import ctypes, os, signal, sys
compare = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
def interrupted_inside(a, b):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C while C code is calling Python
    return 0
numbers = (ctypes.c_int * 2)(2, 1)
ctypes.CDLL(None).qsort(numbers, 2, ctypes.sizeof(ctypes.c_int), compare(interrupted_inside))
print("the import went on", flush=True)
"""


def test_ctrl_c_while_a_library_calls_back_from_c_exits_at_once(tmp_path):
    # torch's C++ initialisers call Python; a KeyboardInterrupt raised there aborted the CLI
    # (exit -6, once in CI). ctypes stands in for them here: it swallows the exception, so
    # a handler that raises lets the import and the command go on (exit 0, "went on").
    (tmp_path / "calls_back_from_c.py").write_text(_CALLS_BACK_FROM_C)
    program = (
        "import sys; sys.argv[0] = 'remat-explorer'; import explorer.cli as cli; "
        "cli._LIBRARIES = ('calls_back_from_c',); sys.exit(cli.main(['models']))"
    )
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=env,
        preexec_fn=_default_sigint, timeout=120,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == ["remat-explorer: interrupted"], done.stderr
    assert "went on" not in done.stdout


_INTERRUPTED_IN_BACKWARD = """
import os, signal, sys, warnings
sys.argv[0] = "remat-explorer"
import explorer.cli as cli
import torch

class Interrupted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C while the backward runs
        return grad * 2

def backward_under_anomaly_mode(args):
    x = torch.ones(3, requires_grad=True)
    with warnings.catch_warnings():  # as AOTAutograd traces a backward, quietly
        warnings.filterwarnings("ignore", "Anomaly Detection has been enabled.")
        with torch.autograd.detect_anomaly(check_nan=False):
            Interrupted.apply(x).sum().backward()
    print("went on")
    return 0

cli.cmd_models = backward_under_anomaly_mode
cli._LIBRARIES = ()
sys.exit(cli.main(["models"]))
"""


def _run_interrupted(program: str, *args: str) -> subprocess.CompletedProcess:
    """Run `program`, which sends itself a Ctrl+C, and check it ended as one does: exit 130
    and one line."""
    done = subprocess.run(
        [sys.executable, "-c", program, *args], capture_output=True, text=True, env=_env(),
        preexec_fn=_default_sigint, timeout=120,
    )  # fmt: skip
    assert done.returncode == 130, done.stderr
    assert done.stderr.strip().splitlines() == ["remat-explorer: interrupted"], done.stderr
    return done


def test_ctrl_c_during_a_traced_backward_is_one_line():
    # AOTAutograd traces the backward under anomaly mode, which reports any error raised in a
    # backward, KeyboardInterrupt included, as a warning with the forward's stack (once in CI,
    # Ctrl+C 3 s into a sweep). catches: that warning printed on the way out
    assert "went on" not in _run_interrupted(_INTERRUPTED_IN_BACKWARD).stdout


_INTERRUPTED_INSIDE_TORCH = """
import os, signal, sys, time
sys.argv[0] = "remat-explorer"
import explorer.cli as cli
import torch

@torch.library.custom_op("remat_test::interrupted", mutates_args=())
def interrupted(x: torch.Tensor) -> torch.Tensor:
    try:
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C while torch runs this kernel
        time.sleep(1)
    except KeyboardInterrupt:  # what torch's C++ makes of it: an abort, or another error
        print("raised inside torch", flush=True)
        raise RuntimeError("KeyboardInterrupt: <EMPTY MESSAGE>") from None
    return x * 2

def run_a_kernel(args):
    if "--beside-a-child" in sys.argv:  # as the solver's window worker: ended on the way out
        import multiprocessing
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
        child.start()
        print(f"child {child.pid}", flush=True)
        try:
            interrupted(torch.ones(3))
        finally:
            child.terminate()
            child.join()
    else:
        interrupted(torch.ones(3))
    print("went on")
    return 0

cli.cmd_models = run_a_kernel
cli._LIBRARIES = ()
sys.exit(cli.main(["models"]))
"""


def test_ctrl_c_while_torch_calls_python_is_not_raised_there():
    # torch calls Python from C++, and a KeyboardInterrupt raised there became an abort (exit
    # -6, 1 interrupt in 300 during a capture) or another error (once in CI, "cannot capture
    # the model: BackendCompilerFailed", exit 2). The kernel above stands in for that C++: it
    # turns the interrupt into a RuntimeError. catches: a KeyboardInterrupt raised while
    # torch's Python is on the stack
    done = _run_interrupted(_INTERRUPTED_INSIDE_TORCH)
    assert "raised inside torch" not in done.stdout
    assert "went on" not in done.stdout


def test_ctrl_c_inside_torch_beside_a_child_process_still_ends_the_child():
    # leaving at once skips the unwinding that ends the solver's children. catches: a child
    # left running after the program has gone
    done = _run_interrupted(_INTERRUPTED_INSIDE_TORCH, "--beside-a-child")
    child = int(done.stdout.split("child ")[1].split()[0])
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_an_error_a_ctrl_c_caused_is_reported_as_the_interrupt(capsys, monkeypatch):
    # main() in a caller's process raises the interrupt wherever it lands, inside torch too,
    # where it can come back as a capture's UserError. catches: that error as exit 2
    def interrupted_capture(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            raise UserError("cannot capture the model: BackendCompilerFailed") from None

    monkeypatch.setattr(sys.modules["explorer.cli"], "cmd_models", interrupted_capture)
    # a caller's process as Python starts it in a terminal; a suite run as a background job
    # has SIGINT ignored, where main() rightly leaves it so (tests/conftest.py puts it back)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    assert main(["models"]) == 130
    assert capsys.readouterr().err.strip() == "remat-explorer: interrupted"


@pytest.mark.parametrize("delay", [0.1, 0.5, 1.5, 3.0])
def test_ctrl_c_at_any_moment_is_one_line_and_130(tmp_path, delay):
    # 0.1 and 0.5 s land while Python loads torch, later ones during capture, profile or the
    # sweep. catches: a handler installed only once the imports are done (a traceback), and
    # a KeyboardInterrupt that escapes main() (exit -2). The child gets SIGINT's default even
    # where the tests run in the background (`cmd &` ignores it, and the CLI rightly keeps
    # an ignored SIGINT ignored: every run then finished and the test was skipped)
    out = tmp_path / "run"
    process = subprocess.Popen(
        [sys.executable, "-m", "explorer.cli", "sweep", "--model", "sample:tiny_cnn",
         "--batch-size", "8", "--input-size", "32", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        preexec_fn=_default_sigint,
    )  # fmt: skip
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip(f"the sweep finished within {delay} s")  # a fast machine
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1:] == ["remat-explorer: interrupted"], stderr
    assert "Traceback" not in stderr
    written = sorted(p.name for p in out.iterdir()) if out.exists() else []
    # no temporary files: the profile, the solver's cache (written once the sweep has solved;
    # an interrupt between it and the front left both on torch 2.10) and the front
    assert set(written) <= {"profile.json", "solver_cache.json", "front.json"}, written
    for name in written:
        json.loads((out / name).read_text())  # whole files only


def test_a_reader_that_leaves_early_is_not_an_error():
    # `remat-explorer models | head -1`. catches: BrokenPipeError reported as an internal
    # error (exit 3), or as "Exception ignored" at exit
    process = subprocess.Popen(
        [sys.executable, "-m", "explorer.cli", "models"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(),
    )  # fmt: skip
    process.stdout.close()  # the reader is gone before anything is written
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141, stderr
    assert stderr == ""


def test_a_bare_whole_number_budget_is_ambiguous(capsys, tiny, tmp_path):
    # "1" meant one byte while "1.0" meant no recomputation. catches: reading a bare number
    # as bytes again
    target = tmp_path / "one.py"
    assert_refused(capsys, export_args(tiny, target, budget="1"), "ambiguous", "1B", "1.0")
    assert not target.exists()
    assert run(capsys, *export_args(tiny, target, budget="1.0"))[0] == 0


def test_a_budget_under_the_minimum_names_the_least_fraction_that_fits(capsys, tiny, tmp_path):
    # googlenet at batch 2, 64 px: 0.5 was refused as "100.9 MiB is below the front's minimum
    # 100.9 MiB", with no way to tell what to ask instead. catches: the budget's bytes or the
    # least fraction missing, or that fraction rounded to nearest (then refused itself)
    points = json.loads(tiny.read_text())["points"]
    lowest = min(p["predicted_peak_bytes"] for p in points)
    target = tmp_path / "low.py"
    code, err = run(capsys, *export_args(tiny, target, budget=f"{lowest - 1}B"))
    assert code == 2 and f"({lowest - 1} bytes)" in err[0] and f"({lowest} bytes;" in err[0]
    fraction = err[0].split("as a fraction, ")[1].split(" or more")[0]
    below = f"{float(fraction) - 0.001:.3f}"
    assert_refused(capsys, export_args(tiny, target, budget=below), f"{fraction} or more")
    assert not target.exists()
    assert run(capsys, *export_args(tiny, target, budget=fraction))[0] == 0


@pytest.mark.parametrize(
    ("baseline", "fixed", "lowest", "expected"),
    [(1000, 200, 600, 0.5), (1000, 200, 601, 0.502), (1000, 200, 599, 0.499),
     (1000, 200, 1000, 1.0), (1000, 200, 100, 0.001), (10**9 + 7, 3, 333_333_337, 0.334)],
)  # fmt: skip
def test_least_fraction_is_the_least_that_parse_budget_reads_as_enough(
    baseline, fixed, lowest, expected
):
    # 601 of 1000 (200 fixed): 0.501 reads as 600 bytes, so 0.502 is the least that fits
    # catches: rounding the fraction to nearest, or off by a thousandth upwards
    fraction = least_fraction(lowest, baseline, fixed)
    assert fraction == expected
    assert parse_budget(f"{fraction:.3f}", baseline, fixed) >= lowest
    if fraction > 0.001:
        assert parse_budget(f"{fraction - 0.001:.3f}", baseline, fixed) < lowest


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0.5", 600), ("1.0", 1000), (".25", 400), ("2KB", 2000), ("1KiB", 1024),
     ("1.5 kb", 1500), ("300B", 300), (0.5, 600), (300, 300)],
)  # fmt: skip
def test_budget_forms(text, expected):
    assert parse_budget(text, baseline_bytes=1000, fixed_bytes=200) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", "ambiguous"), ("4096", "ambiguous"), ("2.0", r"\(0, 1\]"), ("0.0", r"\(0, 1\]"),
     ("1e9", "not a size"), ("4 parsecs", "unknown unit"), ("0B", "positive"),
     (float("nan"), r"\(0, 1\]"), (True, "not a size")],
)  # fmt: skip
def test_budget_refusals(text, expected):
    with pytest.raises(UserError, match=expected):
        parse_budget(text, baseline_bytes=1000, fixed_bytes=200)


def test_a_front_of_one_point_is_said_so(capsys, tmp_path):
    # catches: a step no schedule can lower (a one-sample MLP: the peak is its parameters
    # and their gradients) printed as the same row once per asked point, under "1 Pareto
    # points", and with no word on why the front stops there
    args = ["sweep", "--model", "sample:tiny_mlp", "--batch-size", "1", "--points", "4"]
    assert main([*args, "--solver", "table", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.rstrip().endswith("optimal")]
    assert len(rows) == 1
    assert "front: 1 Pareto point;" in out
    front = json.loads((tmp_path / "front.json").read_text())["baseline"]
    floor, peak = front["fixed_bytes"], front["peak_bytes"]
    assert 0 < floor < peak
    assert (
        "no schedule found has a lower peak than no recomputation: "
        f"{format_bytes(floor)} of its {format_bytes(peak)} ({floor / peak:.0%}) are "
        "parameters, buffers, inputs and parameter gradients"
    ) in out


def test_sweep_prints_a_point_answered_again_under_its_own_heading(capsys, tmp_path, monkeypatch):
    # catches: a budget printed twice with nothing to say why (the sweep answers a budget
    # again when a later search found a faster schedule within it: explorer.sweep)
    def answered_again(solver, solved, on_point) -> None:
        solved[1] = sweep.FrontPoint.of(solver.recall(solved[1].budget_bytes))
        on_point(solved[1])

    monkeypatch.setattr(sweep, "_answer_again", answered_again)
    args = ["sweep", "--model", "sample:tiny_cnn", "--batch-size", "8", "--input-size", "32"]
    assert main([*args, "--points", "4", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    heading = [k for k, line in enumerate(lines) if "found by a later search" in line]
    rows = [line for line in lines if line.strip().endswith(("feasible", "optimal"))]
    assert len(heading) == 1 and lines[heading[0] + 1] in rows
    assert lines[heading[0] + 1].split()[:2] == rows[1].split()[:2]  # the same budget again


def test_a_plan_for_a_device_this_machine_lacks_is_made_on_the_meta_device(capsys, tmp_path):
    # catches: planning for a GPU one does not have reachable from Python only; a plan made
    # on the meta device that names the meta device (it runs nowhere) or leaves a predicted
    # profile.json that a measured sweep in the same folder would then be refused over
    args = ["sweep", "--model", "sample:tiny_dropout", "--batch-size", "64", "--points", "3"]
    assert run(capsys, *args, "--plan-for", "p100", "--out", str(tmp_path))[0] == 0
    front = json.loads((tmp_path / "front.json").read_text())
    assert front["model"]["device"] == "cuda" and front["model"]["model"]["batch_size"] == 64
    assert front["setup"]["device"] == "NVIDIA Tesla P100 SXM2 16 GB (cost model)"
    assert not (tmp_path / "profile.json").exists()
    target = tmp_path / "for_p100.py"
    assert run(capsys, *export_args(tmp_path / "front.json", target, budget="0.9"))[0] == 0
    assert "def wrap(" in target.read_text()


def test_a_plan_made_on_the_meta_device_verifies_to_the_byte_where_it_runs(tmp_path):
    # catches: a meta-device plan that is not the plan of the step that runs (another graph:
    # carried over, not applied; or other bytes): planned for this CPU, it must verify
    # exactly here, its measured peak the predicted one
    args = ["--model", "sample:tiny_dropout", "--batch-size", "64"]
    swept = cli("sweep", *args, "--points", "3", "--plan-for", "cpu", "--out", str(tmp_path))
    assert swept.returncode == 0, swept.stderr
    assert json.loads((tmp_path / "front.json").read_text())["model"]["device"] == "cpu"
    _export_and_verify_to_the_byte(tmp_path, "0.8")


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--batch-size", "8", "--plan-for", "tpu"], "unknown device 'tpu'"),
        (["--batch-size", "8", "--plan-for", "p100", "--device", "cpu"], "leave --device out"),
        (["--batch-size", "8", "--plan-for", "p100", "--amp", "bf16"], "leave --amp out"),
        (["--plan-for", "p100"], "needs --batch-size"),
    ],
)
def test_a_plan_for_another_device_refuses_what_it_cannot_honour(capsys, tmp_path, extra, expected):
    out = tmp_path / "out"
    assert_refused(capsys, ["sweep", "--model", "sample:tiny_cnn", *extra, "--out", str(out)],
                   expected)  # fmt: skip
    assert not out.exists()


def test_a_factory_beside_the_user_is_found(capsys, monkeypatch, tmp_path):
    # catches: "No module named 'remat_cli_factories'" for a module in the folder the command
    # runs in (a console script's import path starts at its own folder)
    (tmp_path / "remat_cli_factories.py").write_text(FACTORIES)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    spec = ["--model", "remat_cli_factories:with_inputs"]
    code, err = run(capsys, "profile", *spec, "--device", "cpu", "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert sys.path[-1] == str(tmp_path)  # after everything installed
