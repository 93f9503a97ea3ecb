#!/usr/bin/env bash
# The CPU cost model against measured training steps (issue 12 item 5; bench/journal/2026.md §27).
#   PY=/work/venv-export/bin/python bench/cost_model_check.sh            # ≈6 min on the 2-core VM
#   PROFILE=cpu.json PY=... bench/cost_model_check.sh                     # also a `memc calibrate` profile
#   REPS=3 PY=... bench/cost_model_check.sh                                # each run 3 times, interleaved: the median
# The configurations of §15 (vit_tiny b32 and b16, ViT-B/16 b4: micro-batches, optimizer offload,
# remat, bf16-mixed), each compiled with the default `--target cpu` (and with PROFILE when given)
# and run at one thread: step_ms (vit_tiny: 40 steps, ViT-B/16: 3; the first included) against
# the estimates. Prints the CPU model and memc's GEMM library, a table, and the median and
# largest error. On a shared VM, run it when nothing else does: the same step measured 1.6× apart
# within minutes there.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-/work/venv-export/bin/python}
OUT=${OUT:-/tmp/cost_model_check}
mkdir -p "$OUT"
cp "$ROOT/build/memc" "$OUT/memc"  # a private copy: build/memc may be relinked meanwhile
M=$OUT/memc
export OMP_NUM_THREADS=1
TINY=$ROOT/data/digits_train.npz B16=/tmp/vit_b_16_random.onnx B16_DATA=/tmp/vit_b_16_data.npz
[ -f "$B16" ] || "$PY" "$ROOT/bench/random_weights.py" "$ROOT/models/vit_b_16_skeleton.onnx" "$B16"
[ -f "$B16_DATA" ] || "$PY" -c '
import numpy as np, sys
rng = np.random.default_rng(0)
np.savez(sys.argv[1], x=rng.standard_normal((24, 3, 224, 224), dtype=np.float32), y=rng.integers(0, 1000, 24).astype(np.int64))' "$B16_DATA"
echo "date: $(date -u +%FT%TZ)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')  load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "memc: $(git -C "$ROOT" rev-parse --short HEAD)"

COMMON="--optimizer adamw --no-dropout --threads 1 --force"
PROFILE=${PROFILE:-cpu}
$M compile "$ROOT/models/vit_tiny.onnx" --batch 16 $COMMON -o "$OUT/host.plan" >/dev/null
$M run "$OUT/host.plan" --data "$TINY" --steps 1 --quiet --json "$OUT/host.json" --force >/dev/null
"$PY" -c 'import json, sys; h = json.load(open(sys.argv[1]))["host_memory"]; print("gemm library:", h["gemm_library"], "| vector math:", h["vector_math"], "| vector loops:", h.get("vector_loops"))' "$OUT/host.json"

rm -f "$OUT/rows.jsonl" "$OUT"/case.* "$OUT"/plan.* "$OUT"/run.*.json
n=0
while IFS='|' read -r label model data steps flags; do  # model: an ONNX path
  [ -n "$label" ] || continue
  $M compile "$model" $flags $COMMON --target cpu -o "$OUT/c.plan" --json >"$OUT/default.json"
  $M compile "$model" $flags $COMMON --target "$PROFILE" -o "$OUT/c.plan" --json >"$OUT/profile.json"
  cp "$OUT/c.plan" "$OUT/plan.$n"
  cp "$OUT/default.json" "$OUT/default.$n.json"
  cp "$OUT/profile.json" "$OUT/profile.$n.json"
  printf '%s\n' "$label|$data|$steps" >"$OUT/case.$n"
  n=$((n + 1))
done <<EOF
vit_tiny b32 fp32|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 32
vit_tiny b32 fp32, 2 micro-batches, offload optimizer|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 32 --micro-batches 2 --offload optimizer
vit_tiny b32 fp32, 4 micro-batches, offload optimizer|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 32 --micro-batches 4 --offload optimizer
vit_tiny b32 fp32, 8 micro-batches, offload optimizer|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 32 --micro-batches 8 --offload optimizer
vit_tiny b32 bf16-mixed, 2 micro-batches|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 32 --precision bf16-mixed --micro-batches 2
vit_tiny b32 bf16-mixed, 16 micro-batches|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 32 --precision bf16-mixed --micro-batches 16
vit_tiny b16 fp32|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 16
vit_tiny b16 fp32, offload optimizer|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 16 --offload optimizer
vit_tiny b16 bf16-mixed|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 16 --precision bf16-mixed
vit_tiny b16 bf16-mixed, offload optimizer|$ROOT/models/vit_tiny.onnx|$TINY|40|--batch 16 --precision bf16-mixed --offload optimizer
ViT-B/16 b4 fp32|$B16|$B16_DATA|3|--batch 4
ViT-B/16 b4 fp32, offload optimizer|$B16|$B16_DATA|3|--batch 4 --offload optimizer
ViT-B/16 b4 fp32, remat blocks, offload optimizer|$B16|$B16_DATA|3|--batch 4 --remat blocks --offload optimizer
ViT-B/16 b4 bf16-mixed, remat blocks, offload optimizer|$B16|$B16_DATA|3|--batch 4 --precision bf16-mixed --remat blocks --offload optimizer
ViT-B/16 b4 bf16-mixed, 4 micro-batches, remat blocks, offload optimizer|$B16|$B16_DATA|3|--batch 4 --precision bf16-mixed --micro-batches 4 --remat blocks --offload optimizer
EOF

# Every configuration's run, REPS rounds over all of them (interleaved, so a slow minute of the
# VM does not land on one configuration's repeats); each row keeps the median step time.
REPS=${REPS:-1}
for ((rep = 0; rep < REPS; rep++)); do
  for ((i = 0; i < n; i++)); do
    IFS='|' read -r label data steps <"$OUT/case.$i"
    $M run "$OUT/plan.$i" --data "$data" --steps "$steps" --threads 1 --quiet --json "$OUT/run.$i.$rep.json" --force >/dev/null
  done
done
for ((i = 0; i < n; i++)); do
  IFS='|' read -r label data steps <"$OUT/case.$i"
  "$PY" -c '
import json, statistics, sys
d, f = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
runs = [json.load(open(p)) for p in sys.argv[4:]]
print(json.dumps({"label": sys.argv[3], "default_ms": d["estimated_step_ms"], "profile_ms": f["estimated_step_ms"],
                  "measured_ms": statistics.median(r["step_ms"] for r in runs), "measured_all_ms": [r["step_ms"] for r in runs],
                  "peak_ok": all(r["measured_peak_bytes"] == r["predicted_peak_bytes"] for r in runs)}))' \
    "$OUT/default.$i.json" "$OUT/profile.$i.json" "$label" "$OUT"/run.$i.*.json >>"$OUT/rows.jsonl"
  tail -1 "$OUT/rows.jsonl"
done

"$PY" - "$OUT/rows.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("\n| configuration | measured ms | default estimate | measured/est | PROFILE's estimate | measured/est |")
print("|---|---:|---:|---:|---:|---:|")
for r in rows:
    print("| %s | %.2f | %.2f | %.2f | %.2f | %.2f |" % (r["label"], r["measured_ms"], r["default_ms"], r["measured_ms"] / r["default_ms"],
                                                   r["profile_ms"], r["measured_ms"] / r["profile_ms"]))
for key in ("default_ms", "profile_ms"):
    err = [abs(r[key] / r["measured_ms"] - 1) for r in rows]
    print("%s: |estimate/measured - 1| median %.1f %%, largest %.1f %%, %d of %d above 30 %%" % (
        "default" if key == "default_ms" else "PROFILE", 100 * statistics.median(err), 100 * max(err), sum(e > 0.3 for e in err), len(err)))
print("measured peak = planned peak in every run:", all(r["peak_ok"] for r in rows))
PY
