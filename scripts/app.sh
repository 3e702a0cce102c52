#!/usr/bin/env bash
# Installs remat-explorer (cached virtualenv) and serves the dashboard on 127.0.0.1.
# Extra arguments go to `remat-explorer app` (e.g. --port 8870 --model sample:unet).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(bash scripts/env.sh)
exec "$venv/bin/remat-explorer" app "$@"
