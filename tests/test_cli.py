"""The command line, as DESIGN.md's contract states it, and its answers to bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "explorer.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=900,
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
    assert_one_line_error(result, "profile")
    assert (out / "profile.json").read_text() == "garbage"
    (out / "profile.json").write_text((swept / "profile.json").read_text())  # another shape
    result = cli(
        "sweep", "--model", "resnet18", "--batch-size", "4", "--input-size", "32", "--out", str(out)
    )
    assert_one_line_error(result, "profile")
    assert not (out / "front.json").exists()


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
