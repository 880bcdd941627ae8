#!/usr/bin/env bash
# The prepared run for a session lent a GPU: find where a regenerate step's time goes on the device, and measure
# the decoder step's cases there. About 8 minutes on an H200; everything it prints is also under $OUT.
#
#   here, once:      bash ../shared/device/pack.sh && echo /.device/ >> .git/info/exclude
#   device tool:     run(command="bash bench/device_check.sh", carry=[".device"], timeout_s=590)
#
# Steps, each with its own limit so that one that hangs leaves the others their time:
#   1. the Philox tests on the GPU (tests/components/test_philox.py), if pytest is there;
#   2. bench/regenerate_profile.py at 1.1B (batch 32 x 16, as the spec path's figure) and at 7B (16 x 128):
#      Triton compilations, host synchronisations, allocations and launches of one profiled step, and the
#      profiler's tables; the 1.1B Chrome trace;
#   3. bench/decoder_step.py at 7B: inference, cache, MeZO's step (regenerate is the profiled one: 50 s a step).
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
bash .device/install.sh && export PYTHONPATH=.:/tmp/site
{ nvidia-smi; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; } 2>&1 | tee "$OUT/device.txt"
if python -c "import pytest" 2>/dev/null; then
  timeout 60 python -m pytest -q -p no:cacheprovider tests/components/test_philox.py 2>&1 | tail -5 | tee "$OUT/philox.txt"
else
  echo "no pytest on this machine: the Philox tests were not run" | tee "$OUT/philox.txt"
fi
timeout 140 python bench/regenerate_profile.py --device cuda --shape 1b --batch 32 --length 16 --steps 2 \
  --trace "$OUT" 2>&1 | tee "$OUT/profile-1b.txt"
timeout 170 python bench/regenerate_profile.py --device cuda --shape 7b --batch 16 --length 128 --steps 1 \
  2>&1 | tee "$OUT/profile-7b.txt"
timeout 200 python bench/decoder_step.py --device cuda --shapes 7b --batch 16 --length 128 --steps 3 --warmup 1 \
  --cases inference cache mezo --json "$OUT/decoder-7b.jsonl" 2>&1 | tail -8 | tee "$OUT/decoder-7b.txt"
