#!/usr/bin/env bash
# Installs what the tests need (virtualenv; Debian's chromium for the browser test, only where
# no chromium is installed and we may install it) and runs ruff and the test suite. Extra
# arguments go to both pytest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/env.sh)
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing Debian's chromium for the browser test" >&2
    (apt-get update -qq && apt-get install -y -qq chromium) >&2
  elif sudo -n true 2>/dev/null; then
    echo "installing Debian's chromium for the browser test (sudo)" >&2
    (sudo -n apt-get update -qq && sudo -n apt-get install -y -qq chromium) >&2
  else
    echo "no chromium, and no root to install it: the browser test will be skipped" >&2
  fi
fi
"$venv/bin/ruff" check explorer widgets apps remat_explorer sample_models tests bench
# the tests on every core, then those marked `serial` (timed searches, the browser, a second
# process) alone: a selection that leaves either part empty is fine, not both
ran=0
pytest() {
  local rc=0
  "$venv/bin/python" -m pytest -q -ra "$@" || rc=$?
  if [ "$rc" = 0 ]; then ran=1; elif [ "$rc" != 5 ]; then exit "$rc"; fi
}
pytest -n auto -m "not serial" "$@"
pytest -m serial "$@"
if [ "$ran" = 0 ]; then
  echo "no tests selected" >&2
  exit 5
fi
