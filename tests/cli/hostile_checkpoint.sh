#!/usr/bin/env bash
# Hostile use of checkpoints (issue 14): a byte flipped anywhere in the data section is caught
# on resume and names the tensor; edited headers, trailing bytes, overlapping offsets and
# impossible metadata are refused; one run at a time holds a folder; kill -9 during checkpoint
# writes, then resume, ends bit-identical to an uninterrupted run with no temporary left.
source "$(dirname "$0")/common.bash" "$@"
W="$TMP/w"
mkdir -p "$W" && cd "$W"
cp "$SRC/models/vit_tiny.onnx" m.onnx
cp "$SRC/data/digits_train.npz" train.npz
npz_py 'a = read_npz(sys.argv[1]); write_npz(sys.argv[2], {"x": ("<f4", (8, 1, 8, 8), a["x"][2][:512]), "y": ("<i8", (8,), a["y"][2][:8])})' \
  "$SRC/data/digits_test.npz" small.npz
# 8 epochs of 2 steps: a checkpoint every 2 steps, 8 in all.
$MEMC compile m.onnx --batch 8 --epochs 8 --steps-per-epoch 2 -o p.plan >/dev/null 2>&1 || fail "compile"
t0=$(date +%s%N)
$MEMC run p.plan --data train.npz --checkpoint ref --quiet >/dev/null 2>&1 || fail "reference run"
run_ms=$(( ($(date +%s%N) - t0) / 1000000 ))
REF=ref/checkpoint.safetensors

ST_PY='
import json, struct, sys
def crc32c(b):
    crc = 0xFFFFFFFF
    for x in b:
        crc ^= x
        for _ in range(8): crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF
def load(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
def save(p, h, data):  # re-signs the header as memc does (canonical JSON without its own checksum)
    m = h["__metadata__"]; m.pop("crc32c:__header__", None)
    m["crc32c:__header__"] = "%08x" % crc32c(json.dumps(h, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode())
    t = json.dumps(h, separators=(",", ":")).encode(); t += b" " * ((8 - len(t) % 8) % 8)
    open(p, "wb").write(struct.pack("<Q", len(t)) + t + data)
'
st_py() { python3 -c "$ST_PY
$1" "${@:2}"; }

# resume_refused NEEDLE: the corrupt checkpoint in bad/ is refused and left as it was.
resume_refused() {
  local before
  before=$(snapshot bad)
  hostile 2 "$1" -- $MEMC run p.plan --eval small.npz --checkpoint bad --resume --quiet
  [ "$before" = "$(snapshot bad)" ] || fail "the corrupt checkpoint was changed"
}

# Flipped bytes over the whole data section: first, last and 30 spread between.
mkdir -p bad
size=$(stat -c %s $REF)
start=$(python3 -c 'import struct,sys; print(8 + struct.unpack("<Q", open(sys.argv[1], "rb").read(8))[0])' $REF)
offsets="$start $((size - 1))"
for i in $(seq 1 30); do offsets="$offsets $((start + (size - start) * i / 31 + i * 7 % 5))"; done
tested=0
for off in $offsets; do
  cp $REF bad/checkpoint.safetensors
  python3 -c 'import sys; p, o = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read()); b[o] ^= 0x20; open(p, "wb").write(b)' bad/checkpoint.safetensors "$off"
  resume_refused "checksum mismatch"
  grep -q "tensor '" "$TMP/err" || fail "flip at $off: the message names no tensor"
  tested=$((tested + 1))
done
echo "data-section offsets tested: $tested of $((size - start)) data bytes, $start-byte header"

# Flips in the header: refused, whatever they hit (length, JSON, names, numbers, checksums).
for i in $(seq 1 10); do
  cp $REF bad/checkpoint.safetensors
  off=$(( (start - 1) * i / 11 + i % 3 ))
  python3 -c 'import sys; p, o = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read()); b[o] ^= 0x01; open(p, "wb").write(b)' bad/checkpoint.safetensors "$off"
  resume_refused "checkpoint.safetensors"
done

# Layout and metadata, re-signed so that only the layout or value check can refuse them.
cp $REF bad/checkpoint.safetensors && printf 'trailing' >>bad/checkpoint.safetensors
resume_refused "trailing bytes"
cp $REF bad/checkpoint.safetensors
st_py '
h, d = load(sys.argv[1]); names = sorted(k for k in h if k != "__metadata__" and h[k]["data_offsets"][1] - h[k]["data_offsets"][0] >= 8)
a, b = h[names[0]], h[names[1]]; n = b["data_offsets"][1] - b["data_offsets"][0]
b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + n] if a["data_offsets"][0] + n <= len(d) else [0, n]
save(sys.argv[1], h, d)' bad/checkpoint.safetensors
resume_refused "overlap"
for edit in 'm["step"] = "-3"' 'm["epoch"] = "1e3"' 'm["step_in_epoch"] = "99"' 'm["seed"] = "7"' 'del m["step"]' \
            'm["step"] = "5"; m["epoch"] = "0"; m["step_in_epoch"] = "5"'; do
  cp $REF bad/checkpoint.safetensors
  st_py "h, d = load(sys.argv[1]); m = h['__metadata__']; $edit; save(sys.argv[1], h, d)" bad/checkpoint.safetensors
  before=$(snapshot bad)
  hostile 2 "checkpoint" -- $MEMC run p.plan --data train.npz --steps 1 --checkpoint bad --resume --quiet
  [ "$before" = "$(snapshot bad)" ] || fail "metadata edit $edit: the checkpoint was changed"
done
cp $REF bad/checkpoint.safetensors
st_py '
h, d = load(sys.argv[1]); m = h["__metadata__"]
for k in [k for k in m if k.startswith("crc32c:")]: del m[k]
t = json.dumps(h).encode(); t += b" " * ((8 - len(t) % 8) % 8); open(sys.argv[1], "wb").write(struct.pack("<Q", len(t)) + t + d)' bad/checkpoint.safetensors
resume_refused "no header checksum"

# One run at a time: a run holding the folder (stopped mid-run) makes a second one exit 2
# naming its pid; two started together: exactly one proceeds. The holder trains 800 steps
# (about 2 s): p.plan's 16 steps (0.16 s) could end before the poll below saw its lock.
$MEMC compile m.onnx --batch 8 --epochs 400 --steps-per-epoch 2 -o long.plan >/dev/null 2>&1 || fail "compile the holder's plan"
$MEMC run long.plan --data train.npz --checkpoint held --quiet >/dev/null 2>"$TMP/held.err" & holder=$!
for _ in $(seq 1 600); do [ "$(cat held/.memc.lock 2>/dev/null)" = "$holder" ] && break; sleep 0.05; done
kill -STOP $holder
hostile 2 "in use by memc pid $holder" -- $MEMC run long.plan --data train.npz --checkpoint held --resume --quiet
kill -CONT $holder
wait $holder && pass "the holder finished" || fail "holder: $(cat "$TMP/held.err")"
for trial in 1 2; do
  $MEMC run p.plan --data train.npz --checkpoint "race$trial" --quiet >/dev/null 2>"$TMP/a.err" & a=$!
  $MEMC run p.plan --data train.npz --checkpoint "race$trial" --quiet >/dev/null 2>"$TMP/b.err" & b=$!
  wait $a; ra=$?; wait $b; rb=$?
  if [ $((ra + rb)) -eq 2 ] && [ $((ra * rb)) -eq 0 ]; then pass "race $trial: exits $ra and $rb: $(cat "$TMP/a.err" "$TMP/b.err" | grep memc:)"
  else fail "race $trial: exits $ra and $rb: $(cat "$TMP/a.err" "$TMP/b.err")"; fi
done

# kill -9 at random moments of a run that checkpoints every 2 steps, then resume: the final
# checkpoint equals the uninterrupted run's byte for byte, and no temporary outlives the resume.
# The kill lands at a random fraction of the uninterrupted run's wall time, counted from the
# start (odd trials) or from the first checkpoint on disk (even trials: later writes).
RANDOM=14
# Trials 9 and 10 kill as soon as a temporary is seen: inside a write, when the poll catches it.
for trial in 1 2 3 4 5 6 7 8 9 10; do
  rm -rf kt
  delay_ms=$(( run_ms * (5 + RANDOM % 90) / 100 ))
  $MEMC run p.plan --data train.npz --checkpoint kt --quiet >/dev/null 2>&1 & victim=$!
  if [ $trial -ge 9 ]; then
    delay_ms=0
    for _ in $(seq 1 100000); do compgen -G "kt/*.tmp.*" >/dev/null && break; kill -0 $victim 2>/dev/null || break; done
  elif [ $((trial % 2)) -eq 0 ]; then
    for _ in $(seq 1 2000); do [ -e kt/checkpoint.safetensors ] && break; sleep 0.005; done
    delay_ms=$((delay_ms / 2))
  fi
  [ $delay_ms -gt 0 ] && sleep "$(printf '%d.%03d' $((delay_ms / 1000)) $((delay_ms % 1000)))"
  kill -9 $victim 2>/dev/null; wait $victim 2>/dev/null
  left=$(ls kt 2>/dev/null | grep -c '\.tmp\.')
  if [ $trial -eq 3 ]; then ( exit 0 ) & dead=$!; wait $dead; mkdir -p kt; echo partial >"kt/checkpoint.safetensors.tmp.$dead"; fi
  resume=""; [ -e kt/checkpoint.safetensors ] && resume=--resume
  timeout -s KILL 60 $MEMC run p.plan --data train.npz --checkpoint kt $resume --quiet >/dev/null 2>"$TMP/err" || fail "trial $trial: resume: $(cat "$TMP/err")"
  if cmp -s kt/checkpoint.safetensors $REF && ! ls kt | grep -q '\.tmp\.'; then
    pass "kill -9 trial $trial at $([ $trial -ge 9 ] && echo "the first temporary seen" || echo "${delay_ms} of ${run_ms} ms") (${resume:-fresh}, $left temp left by the kill): bit-identical, no temp left"
  else fail "kill -9 trial $trial: differs from the uninterrupted run or temp left: $(ls kt)"; fi
done
finish
