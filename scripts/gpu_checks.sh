#!/usr/bin/env bash
# The checks that need a CUDA GPU, in one run, with the Python on PATH (a GPU machine's own
# torch; PuLP and pytest must import): the CUDA tests (profiling with CUDA events, predicted
# peaks against measured to the byte, CUDA dropout masks bitwise, fused dropouts), then what
# the runtime costs against plain torch.compile(aot_eager), with a profile of where. Results
# of the benchmark go to $1 (default bench/results/gpu).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-bench/results/gpu}"
status=0
python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu.py tests/test_dropout_replay.py \
  tests/test_memory.py || status=$?
python bench/runtime.py --device cuda --repeats 20 --profile --results "$out" || status=$?
exit "$status"
