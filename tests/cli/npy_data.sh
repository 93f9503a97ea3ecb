#!/usr/bin/env bash
# Data larger than memory (issue 31): `--data DIR` of .npy files (x.npy and y.npy, or shards
# NAME.K.npy) is read a batch at a time (runtime/npy_stream.h). The same arrays train to the same
# losses as the .npz, bit for bit, however they are sharded (one seeded order over all rows);
# bad folders and non-finite samples are one line naming the file and row; and a dataset 4x the
# process's address-space limit (`ulimit -v`) trains.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"
$MEMC compile models/vit_tiny.onnx --batch 32 --optimizer adamw --lr 2e-3 --epochs 3 -o "$TMP/p.plan" >/dev/null 2>"$TMP/err" || fail "compile: $(cat "$TMP/err")"

# split.py NPZ DIR XCUTS YCUTS: the npz's x and y as .npy files; cuts "a,b" split the rows there
# into shards NAME.0.npy, NAME.1.npy, … (no cut: one NAME.npy).
{
  echo "$NPZ_PY"
  cat <<'PY'
import os, sys
arrays = read_npz(sys.argv[1]); out = sys.argv[2]; os.makedirs(out, exist_ok=True)
for name, cuts in (("x", sys.argv[3]), ("y", sys.argv[4])):
    descr, shape, vals = arrays[name]
    per = len(vals) // shape[0]
    bounds = [0] + [int(c) for c in cuts.split(",") if c] + [shape[0]]
    for k in range(len(bounds) - 1):
        a, b = bounds[k], bounds[k + 1]
        path = os.path.join(out, name + (".%d" % k if len(bounds) > 2 else "") + ".npy")
        open(path, "wb").write(npy(descr, (b - a,) + tuple(shape[1:]), vals[a * per:b * per]))
PY
} >"$TMP/split.py"
losses() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["losses"])' "$1"; }
$MEMC run "$TMP/p.plan" --data data/digits_train.npz --steps 60 --quiet --json "$TMP/npz.json" >/dev/null 2>"$TMP/err" || fail "npz run: $(cat "$TMP/err")"
for layout in "whole::" "shards:300,301,1000:700" "shards:1:1436"; do
  IFS=: read -r kind xs ys <<<"$layout"
  d="$TMP/$kind$xs"
  python3 "$TMP/split.py" data/digits_train.npz "$d" "$xs" "$ys" || { fail "split $layout"; continue; }
  $MEMC run "$TMP/p.plan" --data "$d" --steps 60 --quiet --json "$d.json" >/dev/null 2>"$TMP/err" || { fail "run on $layout: $(cat "$TMP/err")"; continue; }
  [ "$(losses "$d.json")" = "$(losses "$TMP/npz.json")" ] && pass ".npy folder ($kind, x cut at [$xs], y at [$ys]): 60 losses equal the .npz's bit for bit" \
    || fail ".npy folder $layout: losses differ from the .npz's"
done
# Stopped at step 20 and resumed from its checkpoint: the same order, so the uninterrupted losses.
d="$TMP/shards300,301,1000"
$MEMC run "$TMP/p.plan" --data "$d" --steps 20 --quiet --checkpoint "$TMP/ck" --json "$TMP/r1.json" >/dev/null 2>"$TMP/err" || fail "run to 20: $(cat "$TMP/err")"
$MEMC run "$TMP/p.plan" --data "$d" --steps 40 --quiet --checkpoint "$TMP/ck" --resume --json "$TMP/r2.json" >/dev/null 2>"$TMP/err" || fail "resume: $(cat "$TMP/err")"
python3 -c '
import json, sys
whole, first, rest = (json.load(open(p))["losses"] for p in sys.argv[1:4])
assert first + rest == whole, (len(first), len(rest), len(whole))
' "$d.json" "$TMP/r1.json" "$TMP/r2.json" && pass "20 steps, then 40 resumed from the checkpoint: the 60 losses of one run" || fail "resume on a .npy folder"
# The folder serves evaluation too, with the .npz's accuracy.
$MEMC run "$TMP/p.plan" --data "$TMP/whole" --eval "$TMP/whole" --steps 10 --quiet >"$TMP/out_dir" 2>"$TMP/err" || fail "--eval DIR: $(cat "$TMP/err")"
$MEMC run "$TMP/p.plan" --data data/digits_train.npz --eval data/digits_train.npz --steps 10 --quiet >"$TMP/out_npz" 2>"$TMP/err" || fail "--eval npz: $(cat "$TMP/err")"
a_dir=$(grep -o "accuracy [0-9.]*%" "$TMP/out_dir"); a_npz=$(grep -o "accuracy [0-9.]*%" "$TMP/out_npz")
[ -n "$a_dir" ] && [ "$a_dir" = "$a_npz" ] && pass "--eval DIR: $a_dir, as the .npz" || fail "--eval DIR: '$a_dir' against the .npz's '$a_npz'"

# Bad folders: one line, exit 2, naming the file.
mkdir -p "$TMP/empty" "$TMP/noy" "$TMP/mixed" "$TMP/short" "$TMP/shape" "$TMP/nan"
expect_error 2 "holds no .npy files" -- $MEMC run "$TMP/p.plan" --data "$TMP/empty" --steps 1
cp "$TMP/whole/x.npy" "$TMP/noy/"
expect_error 2 "no y.npy" -- $MEMC run "$TMP/p.plan" --data "$TMP/noy" --steps 1
cp "$TMP/whole/x.npy" "$TMP/whole/y.npy" "$TMP/mixed/" && cp "$TMP/whole/x.npy" "$TMP/mixed/x.0.npy"
expect_error 2 "is both x.npy and shards" -- $MEMC run "$TMP/p.plan" --data "$TMP/mixed" --steps 1
cp "$TMP/whole/y.npy" "$TMP/short/" && head -c 100000 "$TMP/whole/x.npy" >"$TMP/short/x.npy"
expect_error 2 "x.npy: array data is" -- $MEMC run "$TMP/p.plan" --data "$TMP/short" --steps 1
cp "$TMP/shards300,301,1000/"* "$TMP/shape/"
npz_py 'import sys; open(sys.argv[1], "wb").write(npy("<f4", (5, 1, 8, 9), [0.0] * 360))' "$TMP/shape/x.4.npy"
expect_error 2 "does not match" -- $MEMC run "$TMP/p.plan" --data "$TMP/shape" --steps 1
# A NaN in row 7 of the last shard: refused when its batch is read, naming the shard and row.
cp "$TMP/shards300,301,1000/"* "$TMP/nan/"
npz_py '
import sys
descr, shape, vals = read_npz(sys.argv[1])["x"]
per = len(vals) // shape[0]
rows = list(vals[1000 * per:]); rows[7 * per + 5] = float("nan")
open(sys.argv[2], "wb").write(npy(descr, (shape[0] - 1000,) + tuple(shape[1:]), rows))' data/digits_train.npz "$TMP/nan/x.3.npy"
expect_error 2 "x.3.npy row 7: array 'x' holds NaN" -- $MEMC run "$TMP/p.plan" --data "$TMP/nan" --epochs 1 --quiet

# 4x the address-space limit: vit_small32's 3x32x32 images in 4 shards, 1.6 GiB, trained
# under ulimit -v 400 MiB (one GEMM thread: OpenBLAS's buffer is 129 MiB a thread; on an AVX-512
# CPU oneDNN's JIT-compiled kernels take 36 MiB more, and 300 MiB no longer held the arena).
if ldd "$MEMC" | grep libasan >/dev/null; then
  echo "skipped: the ulimit check (sanitizer build: ASan's shadow memory)"
elif [ "$(df -Pk "$TMP" | awk 'NR == 2 {print $4}')" -lt 3000000 ]; then
  echo "skipped: the larger-than-memory check needs 3 GB free in $TMP"
else
  limit_kb=409600
  python3 - "$TMP/big" $((4 * limit_kb * 1024)) <<'PY'
import os, struct, sys
out, total = sys.argv[1], int(sys.argv[2])
elems = 3 * 32 * 32
n = total // (elems * 4) + 1
os.makedirs(out)
block = struct.pack("<%df" % elems, *[((i * 37) % 101) / 50.0 - 1.0 for i in range(elems)])
def header(descr, shape):
    d = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, "".join("%d, " % s for s in shape))
    d += " " * ((64 - (10 + len(d) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode()
shards = 4
for k in range(shards):
    rows = n // shards + (1 if k < n % shards else 0)
    with open(os.path.join(out, "x.%d.npy" % k), "wb") as f:
        f.write(header("<f4", (rows, 3, 32, 32)))
        for _ in range(rows // 64): f.write(block * 64)
        f.write(block * (rows % 64))
with open(os.path.join(out, "y.npy"), "wb") as f:
    f.write(header("<i8", (n,)))
    f.write(struct.pack("<%dq" % n, *[i % 10 for i in range(n)]))
PY
  bytes=$(du -cb "$TMP/big" | tail -1 | cut -f1)
  $MEMC compile models/vit_small32.onnx --batch 16 -o "$TMP/s.plan" >/dev/null 2>"$TMP/err" || fail "compile vit_small32: $(cat "$TMP/err")"
  if (ulimit -v $limit_kb; exec timeout -s KILL 300 $MEMC run "$TMP/s.plan" --data "$TMP/big" --steps 30 --threads 1 --quiet --json "$TMP/big.json") \
    >/dev/null 2>"$TMP/err"; then
    python3 -c '
import json, sys
r = json.load(open(sys.argv[1])); data, limit = int(sys.argv[2]), int(sys.argv[3]) * 1024
assert r["steps"] == 30 and data >= 4 * limit, (r["steps"], data, limit)
rss = r["process_peak_rss_bytes"]
print(f"ok: {data / 2**30:.2f} GiB of .npy shards ({data / limit:.1f}x the ulimit -v of {limit / 2**20:.0f} MiB) trained 30 steps; peak RSS {rss / 2**20:.1f} MiB")
' "$TMP/big.json" "$bytes" "$limit_kb" || fail "larger than memory: report $(head -c 300 "$TMP/big.json")"
  else
    fail "larger than memory: $(head -c 300 "$TMP/err")"
  fi
  rm -rf "$TMP/big"
fi
finish
