"""The Python examples of docs/API.md marked `<!-- tested: tests/test_docs.py -->` run as
written: in document order, each in a fresh process, in one folder, so that an example may
import the file an earlier one exported (the training loop imports the quick start's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- tested: tests/test_docs.py -->"


def marked_examples(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each marked Python block, in document order."""
    lines = text.splitlines()
    found = []
    for k, line in enumerate(lines):
        if line.strip() != MARK:
            continue
        assert lines[k + 1] == "```python", f"line {k + 1}: the mark must precede a python block"
        end = lines.index("```", k + 2)
        found.append((k + 3, "\n".join(lines[k + 2 : end]) + "\n"))
    return found


def test_the_marked_examples_are_found():
    examples = marked_examples((ROOT / "docs" / "API.md").read_text())
    assert len(examples) == 5
    assert any("Planner(model, x)" in code for _, code in examples)


@pytest.mark.slow
def test_the_api_examples_run_as_written(tmp_path, quick_search):
    """catches: an example that no longer runs (the quick start asked for half of resnet18's
    activations at batch 8 and 64 px, where its least peak keeps 0.576 of them: BelowMinimum).
    The examples' sweeps refine for quick_search's seconds, which reach them through the
    environment: what they print and export is verified, not polished."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    for line, code in marked_examples((ROOT / "docs" / "API.md").read_text()):
        script = tmp_path / f"example_line_{line}.py"
        script.write_text(code)
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, (
            f"docs/API.md, the example at line {line}:\n{done.stderr[-4000:]}"
        )
