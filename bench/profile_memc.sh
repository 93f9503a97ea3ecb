#!/usr/bin/env bash
# Where does a memc training step spend its time?  (1 BLAS thread)
#   bench/profile_memc.sh [OUTDIR]        (default /tmp/memc_profile)
# 1. /usr/bin/time -v of `memc run --steps 3` and `--steps 3+K`: the difference / K gives
#    per-step user time, sys time and minor page faults (startup and warm-up cancel out).
# 2. The same with GLIBC_TUNABLES that keep freed blocks in the malloc heap
#    (mmap_threshold 32 MiB, trim_threshold/top_pad large): per-tensor buffers are then
#    reused from the heap instead of mmap()ed + munmap()ed each step, which approximates
#    what a single arena would save in page faults / sys time (the memset of every new
#    tensor in Tensor::zeros stays).
# 3. perf record (cpu-clock, user space only: perf_event_paranoid=2) of vit_tiny and
#    vit_small32; top symbols.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=/work/venv/bin/python
OUT=${1:-/tmp/memc_profile}
mkdir -p "$OUT"
cp "$ROOT/build/memc" "$OUT/memc"   # private copy: build/memc may be relinked meanwhile
M=$OUT/memc
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
$PY "$ROOT/bench/torch_train_step.py" --write-data "$OUT/small32.npz" --n 1024 >/dev/null
$M compile "$ROOT/models/vit_tiny.onnx" --batch 64 --optimizer adamw --no-dropout --epochs 1000 -o "$OUT/tiny.plan" >/dev/null
$M compile "$ROOT/models/vit_small32.onnx" --batch 32 --optimizer adamw --no-dropout --epochs 1000 -o "$OUT/small.plan" >/dev/null
TUNE="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=4294967296:glibc.malloc.top_pad=268435456"

measure() {  # name plan data steps tunables -> prints "user sys minflt wall json_step_ms"
  local name=$1 plan=$2 data=$3 steps=$4 tune=$5
  GLIBC_TUNABLES=$tune /usr/bin/time -f "%U %S %R %e" -o "$OUT/$name.time" \
    $M run "$plan" --data "$data" --steps "$steps" --quiet --json "$OUT/$name.json" >/dev/null
  echo "$(cat "$OUT/$name.time") $($PY -c "import json;print(json.load(open('$OUT/$name.json'))['step_ms'])")"
}

echo "== per-step cost by differencing runs (3 pairs); columns: user_ms sys_ms minflt step_ms(json mean)"
for spec in "vit_tiny $OUT/tiny.plan $ROOT/data/digits_train.npz 43" "vit_small32 $OUT/small.plan $OUT/small32.npz 13"; do
  set -- $spec
  for mode in default tuned; do
    tune=""; [ $mode = tuned ] && tune=$TUNE
    for r in 1 2 3; do
      a=($(measure "$1.$mode.short" "$2" "$3" 3 "$tune")); b=($(measure "$1.$mode.long" "$2" "$3" "$4" "$tune"))
      k=$(($4 - 3))
      $PY -c "a=[float(x) for x in '${a[*]}'.split()]; b=[float(x) for x in '${b[*]}'.split()]; k=$k
print('$1 $mode rep$r: user %.2f ms sys %.2f ms minflt %.0f per step; step_ms (mean over %d steps, json) %.2f; wall(3 steps) %.2f s' % ((b[0]-a[0])*1e3/k, (b[1]-a[1])*1e3/k, (b[2]-a[2])/k, $4, b[4], a[3]))"
    done
  done
done

echo "== perf stat (software events), vit_tiny 43 steps"
perf stat -e task-clock,page-faults,minor-faults,major-faults,context-switches,cpu-migrations \
  $M run "$OUT/tiny.plan" --data "$ROOT/data/digits_train.npz" --steps 43 --quiet 2>&1 | grep -vE '^\s*$' || true

for spec in "vit_tiny $OUT/tiny.plan $ROOT/data/digits_train.npz 43" "vit_small32 $OUT/small.plan $OUT/small32.npz 10"; do
  set -- $spec
  echo "== perf record -e cpu-clock (user), $1, $4 steps: top symbols (self %)"
  perf record -q -e cpu-clock -F 2000 -o "$OUT/$1.perf.data" $M run "$2" --data "$3" --steps "$4" --quiet >/dev/null 2>&1
  perf report -i "$OUT/$1.perf.data" --no-children --sort dso,symbol --stdio 2>/dev/null | grep '%' | head -25 || true
  echo "-- by DSO"
  perf report -i "$OUT/$1.perf.data" --no-children --sort dso --stdio 2>/dev/null | grep '%' | head -8 || true
done
