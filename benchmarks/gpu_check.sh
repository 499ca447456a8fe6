#!/usr/bin/env bash
# The prepared GPU check: one call on a lent GPU machine (e.g. one H200) runs everything that needs a
# GPU and writes the figures under $OUT (or ./build/gpu_check). Budget: ~8 minutes.
#   1. environment + `labkit doctor` (catalogue vs measured peak, topology)
#   2. GPU-marked tests (thin CUDA branches: events, max_memory_allocated, NCCL launch)
#   3. benchmarks/bench_peak.py: matmul peak sweep + MFU of a GPT step (CUDA events)
#   4. `labkit run` of the ~1B GPT in bf16 on one GPU: the trainer's MFU (issue #3 goal: >= 55% on H200)
# Usage (device tool): bash benchmarks/gpu_check.sh   — installs labkit into the machine's Python first.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu_check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps -e . >/dev/null 2>&1 || python3 -m pip install -q -e . >"$out/pip.log" 2>&1
python3 -m pip install -q pytest orjson psutil tqdm >/dev/null 2>&1
nvidia-smi | tee "$out/nvidia-smi.txt"
timeout 120 python3 -m labkit.cli doctor --quick --json > "$out/doctor.json" 2>&1; echo "doctor rc=$?"
timeout 180 python3 -m pytest -q -m gpu -p no:cacheprovider tests 2>&1 | tee "$out/gpu_tests.log" | tail -5
timeout 150 python3 benchmarks/bench_peak.py --size 1b --steps 10 --json "$out/bench_peak.json" 2>&1 | tee "$out/bench_peak.log" | tail -25
timeout 200 python3 -m labkit.cli run --model 1b --dtype bf16 -n 1 --steps 20 --warmup-steps 5 --micro-batch 8 \
    --json --save "$out/run_1b_bf16.json" > "$out/run_1b_bf16.log" 2>&1; echo "run rc=$?"
python3 - "$out/run_1b_bf16.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    print(f"1B bf16 trainer: {r['tokens_per_s']:,.0f} tok/s, MFU {r['mfu']:.1%}, peak source {r['peak_source']}")
except Exception as e:  # noqa: BLE001
    print("no trainer record:", e)
PY
