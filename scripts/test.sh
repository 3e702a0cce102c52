#!/usr/bin/env bash
# Installs what the tests need (virtualenv, Debian's chromium for the browser test) and runs
# ruff and the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/env.sh)
if ! command -v chromium >/dev/null 2>&1; then
  echo "installing Debian's chromium for the browser test" >&2
  (apt-get update -qq && apt-get install -y -qq chromium) >&2
fi
"$venv/bin/ruff" check explorer widgets apps sample_models tests bench
"$venv/bin/python" -m pytest -q -ra "$@"
