#!/usr/bin/env bash
# Runs the GPU test suite (tests/gpu) on the lent device machine in one call.
#
# From the project root here: ../shared/device/prepare.sh   (puts wheels in .whl/, golden in .golden/)
# Then one device `run` with carry [".whl", ".golden"] and the command:  bash scripts/run_gpu_suite.sh
# Writes $OUT/gpu-tests.log (full pytest output), $OUT/device.txt (nvidia-smi, probe result) and
# $OUT/junit.xml; prints a short summary last. Extra arguments go to pytest (e.g. -k attention).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/forge-gpu-out}
mkdir -p "$OUT"

if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD:$PWD/plugins/cpu_simd:$PWD/plugins/hip${PYTHONPATH:+:$PYTHONPATH}
export FORGE_GOLDEN=${FORGE_GOLDEN:-$PWD/.golden}
export FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernel-cache}
export PYTHONUNBUFFERED=1 FORGE_REQUIRE_GPU=${FORGE_REQUIRE_GPU:-1}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  python3 -c 'import cuda.bindings as b; print("cuda.bindings", b.__version__)' 2>&1
  python3 -c 'from forge_hip import HipBackend; p = HipBackend().probe()
print("available:", p.available, "score:", p.score, "reason:", p.reason or "-")
for d in p.devices: print(" ", d)
for k, v in p.details: print(" ", k, "->", v)' 2>&1
} | tee "$OUT/device.txt"

python3 -m pytest tests/gpu -v -rs -s --durations=15 --junitxml="$OUT/junit.xml" "$@" \
  2>&1 | tee "$OUT/gpu-tests.log"
rc=${PIPESTATUS[0]}

echo "==== summary (full log: \$OUT/gpu-tests.log) ===="
grep -E "^GPU:|us/kernel|compile .* ms|^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -40
tail -n 1 "$OUT/gpu-tests.log"
exit "$rc"
