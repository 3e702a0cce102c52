"""Reading and writing the files users keep: atomically, and with one-line errors.

Every write goes to a temporary file in the target's folder and is then renamed over the
target, so an error or Ctrl+C never leaves a half-written or damaged file behind. Whatever
the operating system refuses (a read-only folder, a file where a folder should be) becomes
a `UserError` naming the path, before anything is written where possible.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from explorer.errors import UserError

# Top-level modules a training script is likely to import besides the standard library's: a
# schedule file of one of these names, put next to that script, would be imported instead.
ECOSYSTEM_MODULES = frozenset(
    {
        "torch", "torchvision", "torchaudio", "torchtext", "torchdata", "functorch", "triton",
        "numpy", "scipy", "pandas", "PIL", "matplotlib", "sklearn", "tqdm", "pulp", "yaml",
        "transformers", "datasets", "accelerate", "timm", "lightning", "pytorch_lightning",
        "deepspeed", "apex", "einops", "safetensors", "tensorboard", "wandb",
        "explorer", "remat_explorer", "sample_models", "widgets", "apps",
    }
)  # fmt: skip

_UMASK_LOCK = threading.Lock()


def write_atomic(path: Path, text: str) -> Path:
    """Write `text` to `path` so that a crash never leaves a half-written file behind.

    The file gets the permissions of any new file (0666 less the umask), not the 0600 of a
    temporary file. A folder that cannot be created or written is a UserError.
    """
    path = Path(path)
    check_writable_folder(path.parent, what=f"folder of {path.name}")
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a file")
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from exc
    finally:
        if tmp is not None and Path(tmp).exists():
            Path(tmp).unlink()
    return path


def current_umask() -> int:
    """The process umask, read without changing it where /proc allows (threads may be
    creating files meanwhile); elsewhere set and restored under a lock."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def check_writable_folder(folder: Path, *, what: str = "output folder") -> None:
    """Refuse, before any work, a folder that exists as a file, sits under a file, or whose
    nearest existing ancestor cannot be written. Nothing is created here."""
    folder = Path(folder)
    existing = folder
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        if existing == folder:
            raise UserError(f"{folder} is a file; the {what} must be a folder")
        raise UserError(f"{folder} cannot be the {what}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{folder}: the {what} cannot be written (permission denied on {existing})")


def check_module_target(path: Path, *, force: bool, is_schedule: Callable[[Path], bool]) -> None:
    """Refuse an exported module's path that would lose a file or break imports.

    The name must be an importable module name that shadows neither the standard library
    nor a module of the PyTorch ecosystem; an existing file is replaced only if it is itself
    a schedule (`is_schedule`) or `force` is set; the folder must be writable.
    """
    path = Path(path)
    if path.suffix != ".py":
        raise UserError(f"{path}: the exported file must end in .py")
    stem = path.stem
    if not stem.isidentifier():
        raise UserError(f"{path}: the file name must be a Python module name (letters, digits, _)")
    if stem in sys.stdlib_module_names or stem in ECOSYSTEM_MODULES:
        raise UserError(
            f"{path}: `import {stem}` would load this file instead of the module {stem!r}; "
            "choose another name"
        )
    if path.is_dir():
        raise UserError(f"{path} is a folder, not a file")
    if path.exists() and not force and not is_schedule(path):
        raise UserError(
            f"{path} exists and is not a schedule written by remat-explorer; "
            "choose another name, or pass --force to replace it"
        )
    check_writable_folder(path.parent, what=f"folder of {path.name}")


def read_json(path: Path, *, what: str) -> dict:
    """Load a JSON object or raise a UserError naming the file and what is wrong.

    Numbers must be finite: NaN, Infinity and overflowing literals such as 1e400 are refused
    rather than read as float('inf').
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise UserError(f"{path}: no such {what} file") from exc
    except IsADirectoryError as exc:
        raise UserError(f"{path} is a folder; give the {what} file inside it") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: corrupt {what} file (not text)") from exc
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what} file: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: corrupt {what} file (not JSON: {exc})") from exc
    except _NotFinite as exc:
        raise UserError(f"{path}: corrupt {what} file (non-finite number {exc})") from exc
    if not isinstance(data, dict):
        raise UserError(f"{path}: corrupt {what} file (not a JSON object)")
    return data


def optional_count(value: object, unit: str = "bytes") -> int | None:
    """A count (of bytes, or of `unit`) read from a JSON file that may be absent or null
    (written by an older version: None); raises ValueError on anything but a whole number
    >= 0, naming what it should have counted."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a count of {unit}")
    return value


def optional_seconds(value: object) -> float | None:
    """Measured seconds read from a JSON file that may be absent or null (written by an
    older version: None); raises ValueError (TypeError for a value that is no number) on
    anything but a finite number > 0."""
    if value is None:
        return None
    seconds = float(value)  # type: ignore[arg-type]
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{value!r} is not a number of seconds")
    return seconds


def optional_share(value: object) -> float | None:
    """A measured share (a spread, a ratio less one) read from a JSON file that may be absent
    or null (older files: None); raises ValueError (TypeError for a value that is no number)
    on anything but a finite number >= 0."""
    if value is None:
        return None
    share = float(value)  # type: ignore[arg-type]
    if not (math.isfinite(share) and share >= 0):
        raise ValueError(f"{value!r} is not a share")
    return share


class _NotFinite(ValueError):
    pass


def _no_constant(name: str) -> float:
    raise _NotFinite(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotFinite(text)
    return value
