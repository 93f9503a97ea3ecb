#!/usr/bin/env bash
# Hostile but realistic use of outputs (issue 14): an output that names an input is refused
# (exit 2, one line) before any work, even with --force; an existing output is replaced only
# with --force; no pre-existing file changes on a refusal (sha256 before and after).
source "$(dirname "$0")/common.bash" "$@"
W="$TMP/w"
mkdir -p "$W" && cd "$W"
cp "$SRC/models/vit_tiny.onnx" m.onnx
cp "$SRC/data/digits_train.npz" train.npz
cp "$SRC/data/digits_test.npz" test.npz
cp "$SRC/models/vit_tiny.ref.npz" in.npz
$MEMC compile m.onnx --batch 8 --epochs 1 --steps-per-epoch 8 -o p.plan >/dev/null 2>&1 || fail "compile"
$MEMC run p.plan --data train.npz --steps 2 --checkpoint ck --quiet >/dev/null 2>&1 || fail "train"

# refused CODE NEEDLE -- CMD...: hostile, and nothing under $W changed.
refused() {
  local before
  before=$(snapshot "$W")
  hostile "$@"
  [ "$before" = "$(snapshot "$W")" ] || fail "$* changed a file: $(diff <(echo "$before") <(snapshot "$W") | head -5)"
}

# An output that is an input: refused with or without --force.
for force in "" --force; do
  refused 2 "same file as the input" -- $MEMC export p.plan --weights ck -o ck/checkpoint.safetensors $force
  refused 2 "same file as the input" -- $MEMC export p.plan --weights ck -o m.onnx $force
  refused 2 "same file as the input" -- $MEMC export p.plan --weights ck -o p.plan $force
  refused 2 "same file as the input" -- $MEMC compile m.onnx --batch 8 -o m.onnx $force
  refused 2 "same file as the input" -- $MEMC infer m.onnx --input in.npz -o in.npz $force
  refused 2 "same file as the input" -- $MEMC infer m.onnx --input in.npz -o m.onnx $force
  refused 2 "same file as the input" -- $MEMC run p.plan --data train.npz --steps 1 --json train.npz $force --quiet
  refused 2 "same file as the input" -- $MEMC run p.plan --data train.npz --steps 1 --dump-grads train.npz $force --quiet
  refused 2 "same file as the input" -- $MEMC run p.plan --eval test.npz --json test.npz $force --quiet
  refused 2 "same file as the input" -- $MEMC run p.plan --data train.npz --steps 1 --json p.plan $force --quiet
  refused 2 "same file as the input" -- $MEMC run p.plan --data train.npz --steps 1 --json m.onnx $force --quiet
  refused 2 "also the output of --checkpoint" -- $MEMC run p.plan --data train.npz --steps 1 --checkpoint ck --resume --json ck/checkpoint.safetensors $force --quiet
  refused 2 "same file as the input" -- $MEMC inspect p.plan --timeline p.plan $force
  refused 2 "same file as the input" -- $MEMC inspect p.plan --timeline m.onnx $force
done
# Other names for the same file: a hard link, a symlink, a path with dots.
ln m.onnx hard.onnx
ln -s train.npz soft.npz
refused 2 "same file as the input" -- $MEMC compile m.onnx --batch 8 -o hard.onnx --force
refused 2 "same file as the input" -- $MEMC run p.plan --data train.npz --steps 1 --json soft.npz --force --quiet
refused 2 "same file as the input" -- $MEMC infer m.onnx --input in.npz -o ./ck/../in.npz --force
# Two outputs of one run on one path, or the checkpoint's.
refused 2 "also the output of --json" -- $MEMC run p.plan --data train.npz --steps 1 --json r.json --dump-grads ./r.json --quiet
refused 2 "also the output of --checkpoint" -- $MEMC run p.plan --data train.npz --steps 1 --checkpoint ck2 --json ck2/checkpoint.safetensors --quiet
[ ! -e ck2 ] && pass "no checkpoint folder made by a refused run" || fail "ck2 created"

# An existing output: refused without --force, replaced with it.
for f in out.plan out.npz out.onnx out.json out.html grads.npz; do echo "precious $f" >"$f"; done
refused 2 "exists; pass --force" -- $MEMC compile m.onnx --batch 8 -o out.plan
refused 2 "exists; pass --force" -- $MEMC infer m.onnx --input in.npz -o out.npz
refused 2 "exists; pass --force" -- $MEMC export p.plan --weights ck -o out.onnx
refused 2 "exists; pass --force" -- $MEMC run p.plan --data train.npz --steps 1 --json out.json --quiet
refused 2 "exists; pass --force" -- $MEMC run p.plan --data train.npz --steps 1 --dump-grads grads.npz --quiet
refused 2 "exists; pass --force" -- $MEMC inspect p.plan --timeline out.html
refused 2 "exists; pass --force" -- $MEMC calibrate -o out.json
replaced() {  # replaced FILE -- CMD...: exit 0 and FILE now holds something else
  local file=$1; shift 2
  if timeout -s KILL 60 "$@" >/dev/null 2>"$TMP/err" && ! grep -q precious "$file"; then pass "--force replaced $file"; else fail "$* -> $(cat "$TMP/err")"; fi
}
replaced out.plan -- $MEMC compile m.onnx --batch 8 -o out.plan --force
replaced out.npz -- $MEMC infer m.onnx --input in.npz -o out.npz --force
replaced out.onnx -- $MEMC export p.plan --weights ck -o out.onnx --force
replaced out.json -- $MEMC run p.plan --data train.npz --steps 1 --json out.json --force --quiet
replaced grads.npz -- $MEMC run p.plan --data train.npz --steps 1 --dump-grads grads.npz --force --quiet
replaced out.html -- $MEMC inspect p.plan --timeline out.html --force

# IR dumps: a folder holding them already is refused without --force.
$MEMC compile m.onnx --batch 8 --dump-dir dump -o d.plan >/dev/null 2>&1 || fail "compile --dump-dir"
refused 2 "holds IR dumps already" -- $MEMC compile m.onnx --batch 8 --dump-dir dump -o d2.plan
timeout 60 $MEMC compile m.onnx --batch 8 --dump-dir dump -o d2.plan --force >/dev/null 2>"$TMP/err" && pass "--dump-dir --force" || fail "dump --force: $(cat "$TMP/err")"

# Missing folders and folders as outputs.
refused 2 "does not exist" -- $MEMC compile m.onnx --batch 8 -o nowhere/p.plan
refused 2 "is a directory" -- $MEMC run p.plan --data train.npz --steps 1 --json ck --quiet
refused 2 "is a directory" -- $MEMC export p.plan --weights ck -o ck --force

# A killed writer's temporary beside an output goes with the next write; a live one stays.
sleep 1000 & live=$!
( exit 0 ) & dead=$!; wait $dead
echo partial >"out.npz.tmp.$dead"; echo partial >"out.npz.tmp.$live"
$MEMC infer m.onnx --input in.npz -o out.npz --force >/dev/null 2>&1 || fail "infer"
[ ! -e "out.npz.tmp.$dead" ] && [ -e "out.npz.tmp.$live" ] && pass "dead writer's temp removed, live one kept" || fail "temps: $(ls)"
kill $live; rm -f "out.npz.tmp.$live"
ls | grep -q '\.tmp\.' && fail "temporary files left behind: $(ls)"
finish
