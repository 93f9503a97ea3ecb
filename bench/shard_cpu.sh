#!/usr/bin/env bash
# ViT-B/16 (random weights, bench/random_weights.py) at global batch 8, AdamW, fp32, measured on
# this CPU: one rank against 2 MPI ranks (each runs 4 samples) with zero1/zero2/zero3. Prints per
# rank the measured and planned device peak, the mean step time, and the bytes one rank sends per
# step (the plan's collectives under ring algorithms) beside the formula for 4Ψ-byte f32 units:
# zero1 all_reduce 2(N−1)/N + all_gather (N−1)/N, zero2 reduce_scatter + all_gather 2(N−1)/N,
# zero3 two all_gathers + reduce_scatter 3(N−1)/N, each times 4Ψ plus the padding.
# Usage: bench/shard_cpu.sh [build/memc]   (PY: a python with numpy and onnx, for the weights)
set -euo pipefail
cd "${REPO:-$(dirname "$0")/..}"
MEMC=$(realpath "${1:-build/memc}")
PY=${PY:-/work/venv-export/bin/python}
FULL=${FULL:-/tmp/vit_b_16_random.onnx}
DATA=${DATA:-/tmp/vit_b_16_data.npz}
STEPS=${STEPS:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
[ -f "$FULL" ] || "$PY" bench/random_weights.py models/vit_b_16_skeleton.onnx "$FULL"
[ -f "$DATA" ] || "$PY" -c "
import numpy as np, sys
rng = np.random.default_rng(0)
np.savez(sys.argv[1], x=rng.standard_normal((24, 3, 224, 224), dtype=np.float32), y=rng.integers(0, 1000, 24).astype(np.int64))" "$DATA"
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# memc $(git rev-parse --short HEAD); $(nproc) cores split between the ranks (--threads); $STEPS steps each"
row() {  # NP STAGE: the machine's cores split between the ranks (--threads cores/NP each)
  local np=$1 stage=$2 flags=(--batch 8 --optimizer adamw --lr 1e-4)
  local threads=$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))
  flags+=(--threads "$threads")
  [ "$np" -gt 1 ] && flags+=(--devices "$np" --shard "$stage")
  "$MEMC" compile "$FULL" "${flags[@]}" -o "$out/p.plan" --force --json > "$out/c.json"
  if [ "$np" -gt 1 ]; then
    bash tests/comm/mpirun.sh "$np" "$MEMC" run "$out/p.plan" --data "$DATA" --steps "$STEPS" --threads "$threads" --quiet --json "$out/r.json" --force > /dev/null
  else
    "$MEMC" run "$out/p.plan" --data "$DATA" --steps "$STEPS" --threads "$threads" --quiet --json "$out/r.json" --force > /dev/null
  fi
  python3 - "$out/c.json" "$out/r.json" "$np" "$stage" <<'EOF'
import json, sys
c, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
n, stage = int(sys.argv[3]), sys.argv[4]
psi = c["param_count"]
factor = {"none": 0, "zero1": 3, "zero2": 2, "zero3": 3}[stage] * (n - 1) / n
ranks = r.get("ranks", [{"rank": 0, "measured_peak_bytes": r["measured_peak_bytes"], "predicted_peak_bytes": r["predicted_peak_bytes"]}])
peaks = ", ".join("%d: %s / %s" % (e["rank"], format(e["measured_peak_bytes"], ","), format(e["predicted_peak_bytes"], ",")) for e in ranks)
print("| %d | %s | %s | %.0f ms | %.0f ms | %s | %s |" % (n, stage, peaks, r["step_ms"], c["estimated_step_ms"], format(c["comm_bytes_per_step"], ","),
      format(int(factor * 4 * psi), ",")))
EOF
}
echo "| ranks | stage | per-rank peak measured / planned (bytes) | step | estimated | bytes sent per step | formula |"
echo "|---|---|---|---|---|---|---|"
row 1 none
for stage in zero1 zero2 zero3; do row 2 $stage; done
