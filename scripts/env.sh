#!/usr/bin/env bash
# Prints the path of a virtualenv that has everything remat-explorer and its tests need,
# creating it on first use. The environment lives outside the clone, keyed by the dependency
# list in pyproject.toml, so repeated runs (and CI) reuse it; a fresh machine builds it.
set -euo pipefail
cd "$(dirname "$0")/.."
key=$(sed -n '/^dependencies/,/^\[project.scripts\]/p' pyproject.toml | sha256sum | cut -c1-12)
venv="${REMAT_VENV_ROOT:-$HOME/.cache/remat-explorer}/venv-$key"
# one install at a time (the dashboard and the tests started together both rewrote the
# console script, and one failed); the lock is released when this script exits
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
if command -v flock >/dev/null; then
  flock 9
fi
if [ ! -f "$venv/.complete" ]; then
  echo "building $venv (torch and torchvision are large: a few minutes)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip >&2
  "$venv/bin/python" -m pip install -q -e ".[app,test]" >&2
  touch "$venv/.complete"
else
  # point the console script at this checkout (fast: no dependencies are touched)
  "$venv/bin/python" -m pip install -q --no-deps -e . >&2
fi
echo "$venv"
