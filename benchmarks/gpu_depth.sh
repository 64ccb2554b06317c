#!/usr/bin/env bash
# Decode (tg) and prefill (pp) at depth, per KV cache type, on a shape twin: forge bench, and
# llama.cpp's llama-bench on the same twin in the same run when LLAMA_BENCH names its binary
# (benchmarks/llama_cpp_cuda.sh builds one for sm_90). JSON per run under WORK, a table on stdout.
#
#   bash benchmarks/gpu_depth.sh [SPEC] [WORK]
#
# SPEC: a twin spec (default benchmarks/specs/llama31_8b.spec.json.gz); WORK: where the twin and
# the results go (default /tmp/twins). Environment: KV (cache types, default "f16 q8_0"), DEPTHS
# (default 16384,32768), REPS (default 2), BACKEND (default hip), LLAMA_BENCH.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
spec=${1:-$here/specs/llama31_8b.spec.json.gz}
work=${2:-/tmp/twins}
name=$(basename "$spec" .spec.json.gz)
twin=$work/$name-twin.gguf
mkdir -p "$work"
[ -f "$twin" ] || python3 "$here/../scripts/gguf_twin.py" build "$spec" "$twin"
ctx=$(( $(tr , '\n' <<< "${DEPTHS:-16384,32768}" | sort -n | tail -1) + 1024 ))
for kv in ${KV:-f16 q8_0}; do
  python3 -m forge bench -m "$twin" --backend "${BACKEND:-hip}" -c $ctx -p 512 -n 128 \
    -d "${DEPTHS:-16384,32768}" -r "${REPS:-2}" -ctk $kv -ctv $kv -o jsonl \
    > "$work/$name-forge-$kv.jsonl" || echo "forge bench ($kv) failed" >&2
  if [ -n "${LLAMA_BENCH:-}" ]; then
    "$LLAMA_BENCH" -m "$twin" -ngl 99 -fa 1 -p 512 -n 128 -d "${DEPTHS:-16384,32768}" \
      -r "${REPS:-2}" -ctk $kv -ctv $kv -o json > "$work/$name-llama-$kv.json" \
      || echo "llama-bench ($kv) failed" >&2
  fi
done
python3 - "$work" "$name" ${KV:-f16 q8_0} <<'PY'
import json
import sys
from pathlib import Path

work, name, kinds = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
print("| cache | test | forge tok/s | llama.cpp tok/s | forge / llama.cpp |")
print("|---|---|---|---|---|")
for kv in kinds:
    forge_path = work / f"{name}-forge-{kv}.jsonl"
    ours = [json.loads(line) for line in forge_path.read_text().splitlines()] if forge_path.exists() else []
    llama_path = work / f"{name}-llama-{kv}.json"
    theirs = {}
    if llama_path.exists():
        for r in json.loads(llama_path.read_text()):
            kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
            depth = r.get("n_depth", 0)
            theirs[kind + (f" @ d{depth}" if depth else "")] = r["avg_ts"]  # forge's test names
    for r in ours:
        other = theirs.get(r["test"])
        ratio = f"{r['avg_ts'] / other:.2f}x" if other else "-"
        shown = f"{other:,.1f}" if other else "-"
        print(f"| {kv} | {r['test']} | {r['avg_ts']:,.1f} | {shown} | {ratio} |")
PY
