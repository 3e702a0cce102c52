"""Serve the dashboard notebook with Voila on 127.0.0.1: what `remat-explorer app` runs.

The launcher passes its settings to the notebook's kernel as environment variables
(`environment`), and the notebook reads them back (`from_environment`), so the notebook
also runs on its own in Jupyter with the same defaults.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from explorer.errors import UserError

NOTEBOOK = Path(__file__).with_name("dashboard.ipynb")
HOST = "127.0.0.1"
DEFAULT_PORT = 8866
# at its own 224 px: profile, sweep and peers take about 20 s on a 2-core CPU, and the front
# spans a visible trade-off (activations are ~40% of the peak)
DEFAULT_MODEL = "resnet18"
DEFAULT_BATCH_SIZE = 8
READY_PATH = "/voila/static/voila.js"
START_TIMEOUT_S = 120.0

ENV_MODEL = "REMAT_MODEL"
ENV_BATCH_SIZE = "REMAT_BATCH_SIZE"
ENV_INPUT_SIZE = "REMAT_INPUT_SIZE"
ENV_EXPORT_DIR = "REMAT_EXPORT_DIR"


def resolve(
    model: str | None, batch_size: int | None, input_size: int | None
) -> tuple[str, int, int | None]:
    """Fill in the default model and batch size; no input size means the model's own.

    A batch or input size below 1 is refused (a UserError), never replaced by the default:
    the dashboard must show what was asked for. Whether a large batch fits in memory is
    checked when the model is built (Profile), where its input size is known.
    """
    for flag, value in (("--batch-size", batch_size), ("--input-size", input_size)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise UserError(f"{flag} must be a whole number of at least 1, not {value!r}")
    return (
        model or DEFAULT_MODEL,
        DEFAULT_BATCH_SIZE if batch_size is None else batch_size,
        input_size,
    )


def environment(
    model: str | None, batch_size: int | None, input_size: int | None, export_dir: Path
) -> dict[str, str]:
    """The variables that tell the notebook what to show (read by `from_environment`)."""
    model, batch_size, input_size = resolve(model, batch_size, input_size)
    return {
        ENV_MODEL: model,
        ENV_BATCH_SIZE: str(batch_size),
        ENV_INPUT_SIZE: "" if input_size is None else str(input_size),
        ENV_EXPORT_DIR: str(export_dir),
    }


def from_environment(environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """`Dashboard` keyword arguments from the launcher's variables (defaults where unset).
    The folder the launcher ran in, where exports land, is also where a factory module of
    the model's SPEC is looked for (`--model mymodels:make` beside `mymodels.py`): the
    kernel runs in the notebook's own folder."""
    if environ.get(ENV_EXPORT_DIR):
        from explorer.models import importable_from  # torch: the kernel's, not the launcher's

        importable_from(str(Path(environ[ENV_EXPORT_DIR]).resolve()))
    model, batch_size, input_size = resolve(
        environ.get(ENV_MODEL) or None,
        _whole_number(environ, ENV_BATCH_SIZE),
        _whole_number(environ, ENV_INPUT_SIZE),
    )
    return {
        "spec": model,
        "batch_size": batch_size,
        "input_size": input_size,
        "export_dir": environ.get(ENV_EXPORT_DIR) or ".",
    }


def _whole_number(environ: Mapping[str, str], name: str) -> int | None:
    """An unset or empty variable is None; anything but a whole number is a UserError."""
    text = (environ.get(name) or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{name} must be a whole number, not {text!r}") from None


def _import_root() -> str:
    """The folder that holds the `explorer` package (a checkout, or site-packages), so the
    kernel imports the same remat-explorer as this process."""
    import explorer

    return str(Path(explorer.__file__).resolve().parent.parent)


def port_is_free(port: int) -> bool:
    """True if a server could listen on HOST:port now (SO_REUSEADDR, as tornado binds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def voila_command(port: int) -> list[str]:
    """Voila on HOST:port only: no browser, and no quiet move to the next port."""
    return [
        sys.executable, "-m", "voila", str(NOTEBOOK),
        "--no-browser",
        f"--port={port}",
        f"--Voila.ip={HOST}",
        "--Voila.port_retries=0",
        "--Voila.log_level=WARN",
    ]  # fmt: skip


def wait_until_ready(process: subprocess.Popen, url: str, timeout: float) -> bool:
    """Poll Voila's static script (a page GET would start a kernel); False if Voila died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url + READY_PATH.lstrip("/"), timeout=2):
                return True
        except OSError:
            time.sleep(0.3)
    return False


def serve(
    port: int | None, model: str | None, batch_size: int | None, input_size: int | None
) -> int:
    """Serve the dashboard until interrupted; returns Voila's exit status (0 on Ctrl+C).

    Raises `UserError` if the port is taken or out of range. Exported schedules land in the
    directory this was started from.
    """
    port = DEFAULT_PORT if port is None else port
    if not 0 < port < 65536:
        raise UserError(f"--port must be between 1 and 65535, not {port}")
    if not port_is_free(port):
        raise UserError(f"port {port} on {HOST} is already in use; choose another with --port")
    env = {**os.environ, **environment(model, batch_size, input_size, Path.cwd())}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_import_root(), env.get("PYTHONPATH")) if p)
    url = f"http://{HOST}:{port}/"
    print(f"starting the dashboard on {url} ...", flush=True)
    process = subprocess.Popen(voila_command(port), env=env)
    try:
        with _terminate_as_interrupt():
            if wait_until_ready(process, url, START_TIMEOUT_S):
                print(f"remat-explorer dashboard: {url}  (Ctrl+C to stop)", flush=True)
            elif process.poll() is None:
                print(f"Voila has not answered on {url} yet; still waiting", file=sys.stderr)
            return process.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        stop(process)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl+C, so `kill` also stops Voila instead of orphaning it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """Ask a server to stop (Voila shuts its kernels down); kill it if it has not in `timeout`."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
