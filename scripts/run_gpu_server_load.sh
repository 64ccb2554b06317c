#!/usr/bin/env bash
# Load test of `forge serve` on the hip backend, on the lent device machine, in one call.
#
# Carry [".whl", ".whl-server", ".golden"]: .whl from ../shared/device/prepare.sh, .whl-server holds
# wheels of the server extra for Python 3.12 (fastapi, starlette, uvicorn, h11, click, anyio,
# sniffio, httpx, httpcore, idna, certifi, prometheus-client, regex, annotated-doc,
# opentelemetry-api). The default model cannot travel (235 MiB), so its shape twin is built here
# (random weights, same shapes, types and tokenizer). Writes $OUT/server-load.json and
# $OUT/server.log. Extra arguments go to benchmarks/load_server.py.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/forge-gpu-out}
mkdir -p "$OUT" .twins
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  .whl-server/*.whl || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=$PWD:$PWD/plugins/cpu_simd:$PWD/plugins/hip:/tmp/site
export FORGE_CACHE_DIR=${FORGE_CACHE_DIR:-/tmp/forge-kernel-cache} PYTHONUNBUFFERED=1
twin=.twins/default-twin.gguf
[ -f "$twin" ] || python3 scripts/gguf_twin.py build benchmarks/specs/gemma3_270m.spec.json.gz "$twin" \
  || { echo "twin build failed"; exit 1; }
python3 benchmarks/load_server.py --model "$twin" --backend hip --levels 1 8 32 \
  --server-log "$OUT/server.log" --json-out "$OUT/server-load.json" "$@"
rc=$?
[ $rc -ne 0 ] && tail -n 30 "$OUT/server.log"
exit $rc
