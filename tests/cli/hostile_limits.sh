#!/usr/bin/env bash
# Host memory outside the arena (issue 14): under `ulimit -v` from 50 MB up to what a plan
# needs, memc ends (10 s hang timeout) with one line on stderr and an exit status that is not
# a signal: the GEMM library's buffers are bounded before it allocates (runtime/preinit/preinit.cc,
# runtime/host_memory.h). Skipped under AddressSanitizer, whose shadow memory needs terabytes
# of address space.
source "$(dirname "$0")/common.bash" "$@"
if ldd "$MEMC" | grep libasan >/dev/null; then echo "skipped: sanitizer build (ulimit -v cannot hold ASan's shadow memory)"; exit 0; fi
cd "$TMP"
cp "$SRC/models/vit_tiny.onnx" m.onnx
$MEMC compile m.onnx --batch 256 -o p.plan >/dev/null 2>&1 || fail "compile"

# limited MB EXPECT -- CMD...: EXPECT is "ok" (exit 0 and silent) or "any" (0, or one line and 1 or 2).
limited() {
  local mb=$1 expect=$2 rc lines; shift 3
  (ulimit -v $((mb * 1024)); exec timeout -s KILL 10 "$@") >/dev/null 2>"$TMP/err"
  rc=$?
  lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ge 124 ] && [ "$rc" -ne 127 ]; then fail "ulimit -v ${mb} MB: $* -> exit $rc (hang or signal): $(head -c 300 "$TMP/err")"; return; fi
  if [ "$rc" -eq 127 ]; then  # the dynamic loader cannot map memc's libraries: its one line, before memc runs
    grep -q "error while loading shared libraries" "$TMP/err" && [ "$lines" -eq 1 ] && [ "$expect" = any ] \
      && pass "ulimit -v ${mb} MB: exit 127 from the loader: $(cat "$TMP/err")" || fail "ulimit -v ${mb} MB: exit 127: $(cat "$TMP/err")"
    return
  fi
  if [ "$rc" -eq 0 ] && [ "$lines" -eq 0 ]; then pass "ulimit -v ${mb} MB: $1 ${2:-} ran"; return; fi
  if [ "$expect" = any ] && [ "$lines" -eq 1 ] && { [ "$rc" -eq 1 ] || [ "$rc" -eq 2 ]; } && grep -q '^memc: ' "$TMP/err"; then
    pass "ulimit -v ${mb} MB: exit $rc: $(cat "$TMP/err")"; return
  fi
  fail "ulimit -v ${mb} MB: $* -> exit $rc, $lines lines: $(head -c 400 "$TMP/err")"
}
for mb in 50 60 80 100 150 200 250 300 400; do
  limited $mb any -- $MEMC run p.plan --data "$SRC/data/digits_train.npz" --steps 1 --quiet
  limited $mb any -- $MEMC infer m.onnx --input "$SRC/models/vit_tiny.ref.npz" -o "out$mb.npz"
done
limited 4000 ok -- $MEMC run p.plan --data "$SRC/data/digits_train.npz" --steps 1 --quiet --json r.json
python3 -c '
import json, sys
h = json.load(open(sys.argv[1]))["host_memory"]
assert h["address_limit_bytes"] == 4000 * 2**20 and h["gemm_threads"] >= 1 and h["gemm_buffer_bytes"] == h["gemm_threads"] * 129 * 2**20, h
' r.json && pass "the report carries the limit and the GEMM buffers" || fail "host_memory: $(head -c 300 r.json)"
finish
