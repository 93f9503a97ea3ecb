#!/usr/bin/env bash
# The README's first command (scripts/demo.sh) as a test, for the forced ISAs (label isa): the
# digits ViT trains to at least 90 % with planned = measured and the process within its plan
# + 64 MB. Prints the kernels it ran on.
# Usage: demo.sh MEMC SRC
source "$(dirname "$0")/../cli/common.bash" "$@"
cd "$SRC"
MEMC_DEMO_DIR=$TMP bash scripts/demo.sh >"$TMP/out" 2>"$TMP/err" || fail "scripts/demo.sh: $(tail -c 400 "$TMP/err")"
sanitized=0
ldd "$MEMC" | grep libasan >/dev/null && sanitized=1  # ASan's shadow memory is resident: no RSS bound
python3 - "$TMP/report.json" "$sanitized" <<'PY' || fail "demo report: $(head -c 600 "$TMP/report.json")"
import json, sys
r = json.load(open(sys.argv[1]))
rss, plan, host = r["process_peak_rss_bytes"], r["predicted_peak_bytes"], r["host_memory"]
print(f"{host['gemm_library']}; OpenBLAS {host['openblas_core']}; loops {host['vector_loops']}")
print(f"accuracy {100 * r['accuracy']:.2f} %; planned {plan:,} B = measured {r['measured_peak_bytes']:,} B; peak RSS {rss:,} B")
assert r["accuracy"] >= 0.90 and r["measured_peak_bytes"] == plan and (sys.argv[2] == "1" or rss <= plan + 64 * 2**20)
PY
[ "$failures" -eq 0 ] && pass "the demo trains within its plan"
finish
