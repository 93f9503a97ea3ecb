#!/usr/bin/env bash
# Budget-search latency on the ViT-L/16 skeleton (issue 13 item 5: ≤ 3 s of CPU per budget on one
# core): each budget with --json (the ladder compiled too) and without, pinned to core 0; CPU
# seconds are user + system of the whole process (import, search, final compile, plan written).
#   bash bench/search_latency.sh [MEMC] [MEMC_BASELINE]   (a baseline binary runs alongside)
set -euo pipefail
cd "$(dirname "$0")/.."
MEMC=$(realpath "${1:-build/memc}"); BASE=${2:-}
OUT=$(mktemp -d); trap 'rm -rf "$OUT"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
run() {  # run LABEL BINARY BUDGET json|plain
  local extra=(); [ "$4" = json ] && extra=(--json)
  /usr/bin/time -f "%U %S" -o "$OUT/t" taskset -c 0 "$2" compile models/vit_l_16_skeleton.onnx --batch 16 --target h200 \
    --budget "$3" "${extra[@]}" --force -o "$OUT/p.plan" >"$OUT/out" 2>"$OUT/err" || { echo "$1 $3: failed: $(cat "$OUT/err")"; return; }
  local info=""
  [ "$4" = json ] && info=$(python3 -c "import json; d=json.load(open('$OUT/out')); s=d['search']; print(s['candidates_compiled'], 'candidates, peak', d['predicted_peak_bytes'], 'B,', s['chosen']['decisions'])")
  printf "%-7s %-9s %-5s cpu %5.2f s  %s\n" "$3" "$1" "$4" "$(awk '{print $1 + $2}' "$OUT/t")" "$info"
}
for b in 32GB 6GB 4GB 3GB 2GB 1.2GB; do
  for mode in json plain; do
    [ -n "$BASE" ] && run baseline "$BASE" "$b" "$mode"
    run memc "$MEMC" "$b" "$mode"
  done
done
