#!/usr/bin/env bash
# §10 of bench/journal/2026.md: planned peak (and breakdown at the peak) of the torchvision ViT-L/16
# skeleton at batch 16 with AdamW, for the precision / micro-batch / remat ladder, plus compile
# time (median of 3, pinned to one core).
#   bench/ladder_vit_l16.sh [MEMC]        (default /tmp/memc-bench; prints a markdown table)
set -euo pipefail
cd "$(dirname "$0")/.."
MEMC=${1:-/tmp/memc-bench}
PY=${PY:-/work/venv/bin/python}
out=${OUT:-$(mktemp -d)}
export OPENBLAS_NUM_THREADS=1
model=models/vit_l_16_skeleton.onnx
variants=(
  "fp32|--precision fp32 --optimizer adamw"
  "bf16-mixed|--precision bf16-mixed --optimizer adamw"
  "bf16-true|--precision bf16-true --optimizer adamw"
  "fp32, 4 micro-batches|--precision fp32 --micro-batches 4 --optimizer adamw"
  "fp32, remat blocks|--precision fp32 --remat blocks --optimizer adamw"
  "bf16-mixed, 4 micro-batches, remat blocks|--precision bf16-mixed --micro-batches 4 --remat blocks --optimizer adamw"
  "bf16-true, 4 micro-batches, remat blocks|--precision bf16-true --micro-batches 4 --remat blocks --optimizer adamw"
  # extra rows, to separate the passes' effects and to come closer to the articles' last step
  "(extra) fp32, 4 micro-batches, remat blocks|--precision fp32 --micro-batches 4 --remat blocks --optimizer adamw"
  "(extra) bf16-mixed, 4 micro-batches|--precision bf16-mixed --micro-batches 4 --optimizer adamw"
  "(extra) bf16-mixed, remat blocks|--precision bf16-mixed --remat blocks --optimizer adamw"
  "(extra) bf16-true, 4 micro-batches|--precision bf16-true --micro-batches 4 --optimizer adamw"
  "(extra) bf16-true, remat blocks|--precision bf16-true --remat blocks --optimizer adamw"
  "(extra) fp32, naive attention|--precision fp32 --attention naive --optimizer adamw"
  "(extra) bf16-true, SGD, 4 micro-batches|--precision bf16-true --micro-batches 4 --optimizer sgd"
  "(extra) bf16-true, SGD, remat blocks|--precision bf16-true --remat blocks --optimizer sgd"
)
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
i=0
for v in "${variants[@]}"; do
  name=${v%%|*}; flags=${v#*|}
  times=()
  for run in 1 2 3; do
    start=$(date +%s.%N)
    # shellcheck disable=SC2086
    taskset -c 1 "$MEMC" -v compile "$model" --batch 16 $flags --json \
      -o "$out/l$i.plan" >"$out/l$i.json" 2>"$out/l$i.err"
    end=$(date +%s.%N)
    times+=("$(echo "$end - $start" | bc)")
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 2p)
  echo "$name|$flags|$median|${times[*]}" >"$out/l$i.meta"
  i=$((i + 1))
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$out" "$i" <<'PYEOF'
import json, sys
out, n = sys.argv[1], int(sys.argv[2])
GB = 1e9
print("| variant | memc flags | planned peak | GB | params | master_weights | grads | optimizer_state | activations | workspace | lower bound | compile (median of 3) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for i in range(n):
    name, flags, med, runs = open(f"{out}/l{i}.meta").read().strip().split("|")
    d = json.load(open(f"{out}/l{i}.json"))
    b = d["breakdown"]
    f = lambda x: f"{x / GB:.3f}"
    print(f"| {name} | `{flags}` | {d['predicted_peak_bytes']:,} B | {f(d['predicted_peak_bytes'])} | {f(b['params'])} | "
          f"{f(b['master_weights'])} | {f(b['grads'])} | {f(b['optimizer_state'])} | {f(b['activations'])} | "
          f"{f(b['workspace'])} | {f(d['lower_bound_bytes'])} | {float(med):.2f} s ({runs}) |")
print()
for i in range(n):
    name = open(f"{out}/l{i}.meta").read().split("|")[0]
    passes = [l.strip() for l in open(f"{out}/l{i}.err") if l.startswith("memc: pass ") or l.startswith("memc: schedule")]
    print(f"- {name}:")
    for l in passes:
        print(f"  - `{l}`")
PYEOF
