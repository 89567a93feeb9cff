#!/usr/bin/env bash
# The GPU checks of the trainer's working copy, as one script for a lent CUDA host
# (CI never has a GPU). Run from the repository root after `make setup`:
#
#   bash scripts/gpu-check.sh OUT_DIR [RUNS]
#
# It runs the CUDA tests, then RUNS (default 3) of `kelp bench pipeline` and
# `kelp bench train --quick` with `trainer.device: auto` (CUDA when present),
# writing each run's JSON and stderr and nvidia-smi's view into OUT_DIR. Medians
# and the machine go into docs/benchmarks.md by hand.
set -euo pipefail
out=${1:?usage: gpu-check.sh OUT_DIR [RUNS]}
runs=${2:-3}
mkdir -p "$out"
py=.venv/bin/python
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi failed" >> "$out/nvidia-smi.txt"
$py -c "import torch; print(torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '-')" > "$out/torch.txt"
.venv/bin/pytest -q -rs tests/store/hot/test_working_copy.py tests/trainer/test_nonfinite_step.py \
    tests/trainer/test_step_tensor_rows.py > "$out/cuda-tests.txt" 2>&1 || true
for i in $(seq 1 "$runs"); do
    $py -m kelp.cli bench pipeline --json > "$out/pipeline.$i.json" 2> "$out/pipeline.$i.err" || true
    $py -m kelp.cli bench train --quick --json > "$out/train.$i.json" 2> "$out/train.$i.err" || true
done
echo "done: $out"
