#!/usr/bin/env bash
# A lean process (issue 32): CUDA is a module (libmemc_cuda.so) that memc opens with dlopen on
# the first GPU run, so a CPU run maps none of cudart, cuBLAS(Lt), cuDNN or NCCL, starts where
# they are not installed, and fits in little memory: `memc --version` and `memc inspect` hold
# <= 40 MB resident, a CPU run of the digits ViT <= its planned peak + 64 MB, and it trains
# under `ulimit -v` 512 MiB. A module that is missing or broken is one line and exit 2.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"
LIB=$(dirname "$MEMC")/libmemc.so
[ -f "$LIB" ] || LIB=$(ldd "$MEMC" | awk '/libmemc\.so/ {print $3}')
sanitized=no
ldd "$MEMC" | grep libasan >/dev/null && sanitized=yes
cuda_libs='libcuda\.|libcudart|libcublas|libcudnn|libnccl|libnvrtc|libmemc_cuda'

# Nothing of CUDA is a dependency of memc or libmemc: the loader never looks for it.
needed=$(readelf -d "$MEMC" "$LIB" | grep NEEDED)
if echo "$needed" | grep -Eq "$cuda_libs"; then fail "CUDA libraries among memc's or libmemc's NEEDED: $(echo "$needed" | grep -E "$cuda_libs" | tr -s ' ' | tr '\n' ' ')"
else pass "memc and libmemc need $(echo "$needed" | wc -l) libraries, none of them CUDA's"; fi

# peak_rss_kb CMD...: the command's peak resident set (KiB), from the kernel's rusage of a child.
peak_rss_kb() { python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)' "$@"; }

$MEMC --version >"$TMP/v" 2>&1 && grep -q "^memc " "$TMP/v" && pass "memc --version: $(cat "$TMP/v")" || fail "memc --version: $(cat "$TMP/v")"
if [ $sanitized = yes ]; then
  echo "skipped: the RSS and ulimit bounds (sanitizer build: ASan's shadow memory)"
else
  for cmd in "--version" "inspect models/vit_tiny.onnx"; do
    kb=$(peak_rss_kb $MEMC $cmd) || { fail "memc $cmd failed"; continue; }
    [ "$kb" -le 40960 ] && pass "memc $cmd: peak RSS $((kb / 1024)) MiB (<= 40 MB)" || fail "memc $cmd: peak RSS $((kb / 1024)) MiB > 40 MB"
  done
fi

# The demo's plan, trained on the CPU: the loader's log of every object it maps (LD_DEBUG=files
# also logs dlopen) names none of CUDA's, and the report's peak RSS is within plan + 64 MB.
$MEMC compile models/vit_tiny.onnx --batch 32 --optimizer adamw --lr 2e-3 -o "$TMP/p.plan" >/dev/null 2>"$TMP/err" || fail "compile: $(cat "$TMP/err")"
LD_DEBUG=files LD_DEBUG_OUTPUT="$TMP/ld" $MEMC run "$TMP/p.plan" --data data/digits_train.npz --steps 30 --quiet --json "$TMP/r.json" \
  >/dev/null 2>"$TMP/err" || fail "run: $(cat "$TMP/err")"
objects=$(cat "$TMP"/ld.* 2>/dev/null | grep -o 'file=[^ ]*' | sort -u)
if [ -z "$objects" ]; then fail "LD_DEBUG logged nothing"
elif echo "$objects" | grep -Eq "$cuda_libs"; then fail "a CPU run mapped CUDA: $(echo "$objects" | grep -E "$cuda_libs" | tr '\n' ' ')"
else pass "a CPU run maps $(echo "$objects" | wc -l) objects, none of CUDA's"; fi
if [ $sanitized = no ]; then
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
rss, plan = r["process_peak_rss_bytes"], r["predicted_peak_bytes"]
assert r["device"] == "cpu" and 0 < rss <= plan + 64 * 2**20, (rss, plan)
print(f"ok: the digits ViT trains on the CPU in {rss / 2**20:.1f} MiB peak RSS: plan {plan / 2**20:.1f} MiB + {(rss - plan) / 2**20:.1f} MiB (<= 64 MB)")
' "$TMP/r.json" || fail "peak RSS over plan + 64 MB: $(head -c 400 "$TMP/r.json")"
  (ulimit -v 524288; exec timeout -s KILL 120 $MEMC run "$TMP/p.plan" --data data/digits_train.npz --steps 30 --quiet) >/dev/null 2>"$TMP/err" \
    && pass "trains vit_tiny under ulimit -v 512 MiB" || fail "under ulimit -v 512 MiB: $(head -c 300 "$TMP/err")"
fi

# The module's absence or breakage, where the GPU run asks for it: one line naming the file, exit 2.
$MEMC compile models/vit_tiny.onnx --batch 8 --target h200 -o "$TMP/h.plan" >/dev/null 2>"$TMP/err" || fail "compile h200: $(cat "$TMP/err")"
MEMC_CUDA_MODULE=$TMP/none/libmemc_cuda.so expect_error 2 "the CUDA module $TMP/none/libmemc_cuda.so cannot be loaded" -- \
  $MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 1 --device cuda
echo "not a library" > "$TMP/libbroken.so"
MEMC_CUDA_MODULE=$TMP/libbroken.so expect_error 2 "the CUDA module $TMP/libbroken.so cannot be loaded" -- \
  $MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 1 --device cuda:0
# libmemc in a folder without the module (RUNPATH yields to LD_LIBRARY_PATH): the default place.
mkdir -p "$TMP/lib" && cp "$LIB" "$TMP/lib/"
LD_LIBRARY_PATH=$TMP/lib expect_error 2 "the CUDA module $TMP/lib/libmemc_cuda.so cannot be loaded" -- \
  $MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 1 --device cuda
# Without --device, an h200 plan without a usable module falls back to the CPU, as without a GPU.
LD_LIBRARY_PATH=$TMP/lib $MEMC run "$TMP/h.plan" --data data/digits_train.npz --steps 1 --quiet >/dev/null 2>"$TMP/err" \
  && pass "an h200 plan runs on the CPU where the module is absent" || fail "h200 plan without the module: $(cat "$TMP/err")"
finish
