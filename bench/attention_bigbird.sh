#!/usr/bin/env bash
# §9 of bench/journal/2026.md: memory-efficient (tiled) vs naive attention on BigBird original_full
# (bigbird-roberta-base dimensions, models/bigbird_long_skeleton.onnx) at long sequences.
#   bench/attention_bigbird.sh [MEMC]           (default /tmp/memc-bench)
# 1. compile the skeleton at batch 1, --seq 512/1024/2048/4096, --attention naive|tiled (planned only);
# 2. `memc run --steps 1` (one core, OPENBLAS_NUM_THREADS=1) at seq 1024 both ways and at seq 4096
#    tiled (4096 naive plans 25.6 GB, more than this 24 GiB machine has), on a copy of the export
#    WITH random weights written to /tmp by models/export_bigbird_long.py --full-out
#    (memc run refuses a skeleton: "initializer '...': has dims but no data (skeleton model)").
# Env: OUT=DIR (work folder, default mktemp -d; the weighted model is cached as
# /tmp/bigbird_long_full.onnx), RUN_SEQS="1024:naive 1024:tiled 4096:tiled".
set -uo pipefail
cd "$(dirname "$0")/.."
MEMC=${1:-/tmp/memc-bench}
PY=${PY:-/work/venv/bin/python}
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"
FULL=${FULL:-/tmp/bigbird_long_full.onnx}
RUN_SEQS=${RUN_SEQS:-"1024:naive 1024:tiled 4096:tiled"}
export OPENBLAS_NUM_THREADS=1
SKEL=models/bigbird_long_skeleton.onnx
echo "memc: $MEMC (sha256 $(sha256sum "$MEMC" | cut -c1-16)…)"
"$MEMC" inspect "$SKEL" --batch 1 --seq 1024 | grep -E "^(params|forward)"

# 1. planned
for s in 512 1024 2048 4096; do
  for a in naive tiled; do
    "$MEMC" -v compile "$SKEL" --batch 1 --seq $s --attention $a --optimizer adamw --json \
      -o "$out/p${s}_$a.plan" >"$out/p${s}_$a.json" 2>"$out/p${s}_$a.err" || echo "compile seq $s $a failed: $(cat "$out/p${s}_$a.err")"
  done
  "$MEMC" inspect "$SKEL" --batch 1 --seq $s --json >"$out/inspect$s.json"
done

# 2. measured
if [ ! -f "$FULL" ]; then
  "$PY" models/export_bigbird_long.py --out "$out/skeleton_copy.onnx" --full-out "$FULL" >&2
  cmp "$out/skeleton_copy.onnx" "$SKEL" && echo "re-export: skeleton byte-identical to $SKEL"
fi
for rs in $RUN_SEQS; do
  s=${rs%%:*}; a=${rs#*:}
  "$PY" -c "
import numpy as np, sys
s = int(sys.argv[1]); rng = np.random.default_rng(s)
np.savez(sys.argv[2], input_ids=rng.integers(5, 50358, (2, s)).astype(np.int64),
         attention_mask=np.ones((2, s), np.int64), y=rng.integers(0, 2, 2).astype(np.int64))" $s "$out/data$s.npz"
  "$MEMC" compile "$FULL" --batch 1 --seq $s --attention $a --optimizer adamw --json -o "$out/r${s}_$a.plan" >"$out/r${s}_$a.cjson"
  echo "run seq $s $a: load average before $(cut -d' ' -f1-3 /proc/loadavg)"
  start=$(date +%s.%N)
  /usr/bin/time -f "%e s wall, max RSS %M KiB" -o "$out/r${s}_$a.time" \
    taskset -c 1 "$MEMC" run "$out/r${s}_$a.plan" --data "$out/data$s.npz" --steps 1 --json "$out/r${s}_$a.rjson" --quiet \
    >"$out/r${s}_$a.out" 2>"$out/r${s}_$a.rerr"
  echo "  rc $?, $(cat "$out/r${s}_$a.time"), load average after $(cut -d' ' -f1-3 /proc/loadavg); $(tr '\n' ' ' <"$out/r${s}_$a.out") $(cat "$out/r${s}_$a.rerr")"
done

"$PY" - "$out" "$RUN_SEQS" <<'PYEOF'
import json, os, sys
out, runs = sys.argv[1], sys.argv[2].split()
B, H, L = 1, 12, 12
GB = 1e9
print("\nplanned (batch 1, AdamW, fp32):\n")
print("| seq | forward FLOP | one S×S f32 matrix (B·H·S²·4) | attention | planned peak | activations at peak | naive − tiled activations | = matrices per layer | activations naive/tiled | peak naive/tiled |")
print("|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
for s in (512, 1024, 2048, 4096):
    mat = B * H * s * s * 4
    flop = json.load(open(f"{out}/inspect{s}.json")).get("forward_flops")
    d = {a: json.load(open(f"{out}/p{s}_{a}.json")) for a in ("naive", "tiled")}
    act = {a: d[a]["breakdown"]["activations"] for a in d}
    pk = {a: d[a]["predicted_peak_bytes"] for a in d}
    diff = act["naive"] - act["tiled"]
    for a in ("naive", "tiled"):
        extra = (f"{diff / GB:.3f} GB | {diff / (L * mat):.2f} | {act['naive'] / act['tiled']:.2f}× | {pk['naive'] / pk['tiled']:.2f}×"
                 if a == "naive" else " | | | ")
        print(f"| {s} | {flop if flop is None else format(flop, ',')} | {mat / 1e6:.1f} MB | {a} | {pk[a]:,} B ({pk[a] / GB:.2f} GB) | "
              f"{act[a]:,} B ({act[a] / GB:.2f} GB) | {extra} |")
print("\nmeasured (memc run --steps 1, one core):\n")
print("| seq | attention | planned peak | measured peak | equal | step_ms (1 step) | loss | wall (process) |")
print("|---:|---|---:|---:|---|---:|---:|---|")
for rs in runs:
    s, a = rs.split(":")
    p = f"{out}/r{s}_{a}.rjson"
    t = open(f"{out}/r{s}_{a}.time").read().strip().splitlines()[-1] if os.path.exists(f"{out}/r{s}_{a}.time") else "?"
    if not os.path.exists(p):
        print(f"| {s} | {a} | | | | | | failed: {open(f'{out}/r{s}_{a}.rerr').read().strip()[:200]} |")
        continue
    r = json.load(open(p))
    print(f"| {s} | {a} | {r['predicted_peak_bytes']:,} B | {r['measured_peak_bytes']:,} B | "
          f"{'yes' if r['predicted_peak_bytes'] == r['measured_peak_bytes'] else '**no**'} | {r['step_ms']:.0f} | {r['loss']:.4f} | {t} |")
PYEOF
