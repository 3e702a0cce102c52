"""Reading and writing the files users keep: atomically, and with one-line errors."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from explorer.errors import UserError


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` so that a crash never leaves a half-written file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_json(path: Path, *, what: str) -> dict:
    """Load a JSON object or raise a UserError naming the file and what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError as exc:
        raise UserError(f"{path}: no such {what} file") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: corrupt {what} file (not JSON: {exc})") from exc
    if not isinstance(data, dict):
        raise UserError(f"{path}: corrupt {what} file (not a JSON object)")
    return data
