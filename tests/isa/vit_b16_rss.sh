#!/usr/bin/env bash
# The plan holds the whole process (issue 38): ViT-B/16 at batch 2 (fp32, AdamW; its 330 MB of
# weights seeded by fill_skeleton) trains a step with the process's peak RSS within the planned
# peak + 5 % + 64 MB. Run natively and under each forced ISA (tests/CMakeLists.txt, label isa);
# prints the kernels it ran on.
# Usage: vit_b16_rss.sh MEMC SRC FILLED_MODEL
source "$(dirname "$0")/../cli/common.bash" "$@"
MODEL=$3
if ldd "$MEMC" | grep libasan >/dev/null; then echo "skipped: sanitizer build (ASan's shadow memory is resident)"; exit 0; fi
$MEMC compile "$MODEL" --batch 2 --optimizer adamw --precision fp32 -o "$TMP/p.plan" >/dev/null 2>"$TMP/err" || fail "compile: $(cat "$TMP/err")"
# Two images and labels as .npy files, without NumPy.
python3 - "$TMP/data" <<'PY'
import os, struct, sys
out = sys.argv[1]; os.makedirs(out)
def npy(path, descr, shape, fmt, values):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, "".join("%d, " % s for s in shape))
    d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + struct.pack("<%d%s" % (len(values), fmt), *values))
n = 2 * 3 * 224 * 224
npy(os.path.join(out, "x.npy"), "<f4", (2, 3, 224, 224), "f", [((i * 37) % 101) / 50.0 - 1.0 for i in range(n)])
npy(os.path.join(out, "y.npy"), "<i8", (2,), "q", [3, 7])
PY
$MEMC run "$TMP/p.plan" --data "$TMP/data" --steps 1 --quiet --json "$TMP/r.json" >/dev/null 2>"$TMP/err" || fail "run: $(cat "$TMP/err")"
python3 - "$TMP/r.json" <<'PY' || fail "peak RSS beyond the plan: $(head -c 600 "$TMP/r.json")"
import json, sys
r = json.load(open(sys.argv[1]))
rss, plan, host = r["process_peak_rss_bytes"], r["predicted_peak_bytes"], r["host_memory"]
bound = plan * 1.05 + 64 * 2**20
print(f"{host['gemm_library']}; OpenBLAS {host['openblas_core']}; loops {host['vector_loops']}")
print(f"planned {plan:,} B = measured {r['measured_peak_bytes']:,} B; process peak RSS {rss:,} B (bound {bound:,.0f} B)")
assert r["measured_peak_bytes"] == plan and rss <= bound
PY
[ "$failures" -eq 0 ] && pass "ViT-B/16 b2: the process stays within its plan + 5 % + 64 MB"
finish
