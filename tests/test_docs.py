"""The Python examples of docs/API.md marked `<!-- tested: tests/test_docs.py -->` run as
written, each in a fresh process. An example that imports the file an earlier one exported
(the training loop imports the quick start's) runs after it, in the same folder; the others
run as tests of their own, so that the suite's workers share them."""

from __future__ import annotations

import os
import re
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


def example_groups(examples: list[tuple[int, str]]) -> list[list[tuple[int, str]]]:
    """The examples split into groups that run apart: an example that imports a module an
    earlier one exported (`.export("name.py")`) joins that example's group, in document
    order; any other starts a group of its own."""
    groups: list[list[tuple[int, str]]] = []
    exported_by: dict[str, int] = {}  # module name -> its group
    for line, code in examples:
        imported = re.findall(r"^\s*(?:import|from)\s+(\w+)", code, re.MULTILINE)
        known = [exported_by[name] for name in imported if name in exported_by]
        group = known[0] if known else len(groups)
        if group == len(groups):
            groups.append([])
        groups[group].append((line, code))
        for name in re.findall(r"export\(\s*\"(\w+)\.py\"", code):
            exported_by[name] = group
    return groups


EXAMPLES = marked_examples((ROOT / "docs" / "API.md").read_text())
GROUPS = example_groups(EXAMPLES)


def test_the_marked_examples_are_found():
    assert len(EXAMPLES) == 5
    assert any("Planner(model, x)" in code for _, code in EXAMPLES)
    # catches: the training loop run apart from the quick start whose export it imports
    starts = [[code.splitlines()[0] for _, code in group] for group in GROUPS]
    assert [len(group) for group in GROUPS] == [2, 1, 1, 1], starts
    assert "import resnet18_70" in GROUPS[0][1][1]


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS, ids=[f"line_{g[0][0]}" for g in GROUPS])
def test_the_api_examples_run_as_written(group, tmp_path, quick_search):
    """catches: an example that no longer runs (the quick start asked for half of resnet18's
    activations at batch 8 and 64 px, where its least peak keeps 0.576 of them: BelowMinimum).
    The examples' sweeps refine for quick_search's seconds, which reach them through the
    environment: what they print and export is verified, not polished."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    for line, code in group:
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
