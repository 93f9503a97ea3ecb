#!/usr/bin/env bash
# Data parallel over MPI ranks (passes/shard.h): a plan compiled with --devices N and run as N
# ranks trains the same model as one device with the same global batch.
#   - after 5 steps with dropout on, the losses match step for step and the parameters and
#     optimizer states (the consolidated checkpoint) equal the one-device run's, relative to each
#     tensor's largest value: with SGD+momentum every element within 1e-5 in fp32. AdamW's
#     first update is lr·sign(g), so an element whose gradient is at the level of f32 summation
#     noise moves ±lr whichever way the ranks' partial sums round: there, every element whose
#     gradient is not identically zero (second moment > 1e-18; the attention key bias's is zero:
#     softmax ignores it) must be within 1e-5 except at most 0.05% of them, and those within
#     2·lr per step. bf16-mixed (bf16 GEMMs round the two splits' partial sums differently):
#     losses within 2^-8 relative, SGD+momentum every parameter within 2^-7, AdamW 99% of the
#     elements within 2^-8 and all within 2·lr per step, optimizer states (gradients from bf16
#     GEMMs) within 8 times those;
#   - every rank's measured device peak equals the plan's, in rank 0's report;
#   - a checkpoint written by 2 ranks resumes on 1 and on 4, continuing the uninterrupted losses,
#     and memc export reads a sharded checkpoint unchanged;
#   - a sharded plan without mpirun, or a job of the wrong size, is one line and exit 2;
#   - a BatchNorm in train() normalizes with the whole batch's statistics on every rank.
source "$(dirname "$0")/common.bash" "$@"
cd "$SRC"
command -v mpirun >/dev/null || { echo "SKIP: no mpirun (scripts/setup.sh installs OpenMPI)"; exit 77; }
ranks() { local np=$1; shift; bash tests/comm/mpirun.sh "$np" "$@"; }
MB="" MODEL=vit_tiny TAG=""  # the model of one_device and check_case ($TAG names their folders)
DATA="--data data/digits_train.npz"
COMMON="--batch 8 --lr 2e-3 --clip-grad-norm 1.0"

# compare.py A.json B.json CKPT_A CKPT_B TOL MODE FRACTION: losses and every checkpoint tensor
# within TOL relative to the tensor's largest value; MODE adamw lets FRACTION of the elements
# (noise-level gradients) be farther, within 2·lr per step, and skips zero-gradient ones (MODE
# adafactor: the same, without the skip); MODE
# adam8bit lets FRACTION of the elements and 8-bit codes (counted together) differ so, and skips
# the elements whose second moment's code is 0 (zero-gradient ones).
COMPARE='
import json, struct, sys
def tensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    head = json.loads(b[8:8 + n])
    out = {}
    for k, v in head.items():
        if k == "__metadata__": continue
        s, e = v["data_offsets"]; raw = b[8 + n + s:8 + n + e]
        if v["dtype"] == "F32": out[k] = struct.unpack("<%df" % (len(raw) // 4), raw)
        elif v["dtype"] == "BF16": out[k] = [struct.unpack("<f", b"\0\0" + raw[i:i + 2])[0] for i in range(0, len(raw), 2)]
        else: out[k] = struct.unpack("<%dB" % len(raw), raw)
    return out
ra, rb = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
tol, mode, fraction = float(sys.argv[5]), sys.argv[6], float(sys.argv[7])
loss_tol = max(tol, 2.0 ** -8) if tol > 1e-4 else tol
la, lb = ra["losses"], rb["losses"]
assert len(la) == len(lb) and len(la) > 0, (la, lb)
for i, (x, y) in enumerate(zip(la, lb)):
    assert abs(x - y) <= loss_tol * max(abs(x), 1e-3), "step %d loss %r vs %r" % (i + 1, x, y)
ta, tb = tensors(sys.argv[3]), tensors(sys.argv[4])
assert sorted(ta) == sorted(tb), set(ta) ^ set(tb)
worst, counted, over, zero = 0.0, 0, 0, 0
bound = 2 * 2e-3 * len(la)
# An optimizer state whose gradient is zero in exact arithmetic (the momentum of a bias right
# before a BatchNorm with batch statistics) holds f32 summation noise in both runs, below 1e-4
# of the largest state: both must stay that small, whatever their ratio.
kind = lambda k: k.startswith(("exp_avg", "momentum_buffer"))
largest = max([abs(v) for k in ta if kind(k) and ".q8." not in k for v in ta[k]] or [0.0])
noise = 0
for k in ta:
    a, b = ta[k], tb[k]
    is_state = kind(k)
    if is_state and ".q8." not in k and largest > 0 and max(abs(v) for v in a + b) <= 1e-4 * largest:
        noise += 1
        continue
    scale = max(max(abs(v) for v in a), 1e-6)
    t = tol * 8 if is_state and tol > 1e-4 else tol
    v = ta.get("exp_avg_sq." + k) if mode == "adamw" else None
    if mode == "adam8bit" and "exp_avg_sq.q8." + k in ta:  # code 0: below the block map, as 0 is
        v = [0.0 if c == 0 else 1.0 for c in ta["exp_avg_sq.q8." + k]]
    if ".q8." in k:  # adam8bit codes: a moment at a rounding boundary may take the next code
        counted += len(a)
        over += sum(x != y for x, y in zip(a, b))
        continue
    for i, (x, y) in enumerate(zip(a, b)):
        if v is not None and v[i] <= 1e-18:
            zero += 1
            continue
        d = abs(x - y) / scale
        counted += 1
        if d <= t:
            worst = max(worst, d)
        elif mode in ("adamw", "adam8bit", "adafactor") and abs(x - y) <= bound:
            over += 1
        else:
            raise AssertionError("%s[%d] differs by %.3g of its largest value (%r vs %r)" % (k, i, d, x, y))
assert over <= fraction * counted, "%d of %d elements beyond %g" % (over, counted, tol)
print("%d tensors, %d elements within %.3g relative (%d beyond, within 2 lr/step; %d with zero gradient; %d states at noise level)" % (len(ta), counted - over, worst, over, zero, noise))
'
# peaks.py R.json N: rank 0 lists N ranks, each with measured = predicted.
PEAKS='
import json, sys
r = json.load(open(sys.argv[1])); n = int(sys.argv[2])
assert r["devices"] == n and len(r["ranks"]) == n, r.get("ranks")
for e in r["ranks"]:
    assert e["measured_peak_bytes"] == e["predicted_peak_bytes"] > 0, e
print(" ".join(str(e["measured_peak_bytes"]) for e in r["ranks"]))
'

one_device() {  # precision optimizer → $TMP/one-$precision-$optimizer/{plan,ckpt,r.json}
  local p=$1 o=$2 d=$TMP/one$TAG-$1-$2
  mkdir -p "$d"
  $MEMC compile models/$MODEL.onnx $COMMON --optimizer "$o" --precision "$p" -o "$d/plan" >/dev/null 2>"$TMP/err" || { fail "compile $p: $(cat "$TMP/err")"; return; }
  $MEMC run "$d/plan" $DATA --steps 5 --quiet --checkpoint "$d/ckpt" --json "$d/r.json" >/dev/null 2>"$TMP/err" || fail "run $p: $(cat "$TMP/err")"
}

check_case() {  # NP STAGE PRECISION OPTIMIZER TOL FRACTION [OFFLOAD]
  local np=$1 stage=$2 p=$3 o=$4 tol=$5 fraction=$6 off=${7:-none} d=$TMP/$1$TAG-$2-$3-$4-${7:-none}${MB:+-mb$MB}
  local one=$TMP/one$TAG-$p-$o
  mkdir -p "$d"
  $MEMC compile models/$MODEL.onnx $COMMON --optimizer "$o" --precision "$p" --devices "$np" --shard "$stage" --offload "$off" ${MB:+--micro-batches $MB} -o "$d/plan" >/dev/null 2>"$TMP/err" \
    || { fail "compile $np $stage $p $off: $(cat "$TMP/err")"; return; }
  [ "$off" = none ] || stage="$stage offload $off"
  [ -z "$MB" ] || stage="$stage, $MB micro-batches"
  ranks "$np" $MEMC run "$d/plan" $DATA --steps 5 --quiet --checkpoint "$d/ckpt" --json "$d/r.json" >"$d/out" 2>"$d/err" \
    || { fail "$np ranks $stage $p: $(tail -3 "$d/err")"; return; }
  local same peaks
  same=$(python3 -c "$COMPARE" "$one/r.json" "$d/r.json" "$one/ckpt/checkpoint.safetensors" "$d/ckpt/checkpoint.safetensors" "$tol" "$o" "$fraction" 2>&1) \
    && pass "$MODEL ${COMMON%% --lr*} $np ranks $stage $p $o = one device after 5 steps: losses and $same" || fail "$MODEL $np ranks $stage $p $o vs one device: $same"
  peaks=$(python3 -c "$PEAKS" "$d/r.json" "$np" 2>&1) && pass "$MODEL $np ranks $stage $p $o: measured = planned on every rank ($peaks bytes)" \
    || fail "$np ranks $stage $p $o peaks: $peaks"
}

one_device fp32 momentum
one_device fp32 adamw
one_device bf16-mixed momentum
one_device bf16-mixed adamw
for stage in zero1 zero2 zero3; do
  check_case 2 $stage fp32 momentum 1e-5 0
  check_case 2 $stage fp32 adamw 1e-5 0.0005
  check_case 2 $stage bf16-mixed momentum 0.0078125 0
  check_case 2 $stage bf16-mixed adamw 0.00390625 0.01
done
check_case 4 zero2 fp32 momentum 1e-5 0
check_case 4 zero3 fp32 adamw 1e-5 0.0005
# Offload: the optimizer state in host memory, or the parameters too (each rank's zero3 shards
# streamed from the host, ZeRO-Infinity style).
check_case 2 zero2 fp32 adamw 1e-5 0.0005 optimizer
check_case 2 zero3 bf16-mixed adamw 0.00390625 0.01 optimizer
check_case 2 zero3 fp32 adamw 1e-5 0.0005 params
check_case 2 zero3 bf16-mixed adamw 0.00390625 0.01 params
check_case 4 zero3 fp32 momentum 1e-5 0 params
# adam8bit: a flat unit places each parameter, and cuts each rank's share, at multiples of the
# 2048-element quantization block (ShardOptions::align), so every rank quantizes one device's
# blocks; the consolidated checkpoint holds one device's codes and block maxima.
one_device fp32 adam8bit
for stage in zero1 zero2 zero3; do
  check_case 2 $stage fp32 adam8bit 1e-5 0.0005
done
check_case 4 zero3 fp32 adam8bit 1e-5 0.0005 params
# bf16-mixed adam8bit amplifies rounding: one device at batch 8 and as 2 micro-batches of 4
# already differ by up to 0.5 in a weight after 5 steps (23,596 of 36,436 codes differ). Two
# ranks of 4 rows round their bf16 gradients as 2 micro-batches do, so against that one device
# run every code is equal and every element within 1e-6 (the f32 sums' order; 3.6e-7 seen).
# N ranks sum N whole gradients, as micro-batches do without accumulate_gemm (which adds each
# later micro-batch's weight gradient inside its GEMM: another summation order in fp32, and no
# rounding to bf16 before the sum in bf16-mixed), so these references turn it off.
UNFUSED_MB="--disable-pass accumulate_gemm --micro-batches"
TAG=-mb2 COMMON="$COMMON $UNFUSED_MB 2" one_device bf16-mixed adam8bit
TAG=-mb2 check_case 2 zero2 bf16-mixed adam8bit 1e-6 0
# Adafactor: its factored statistics follow each parameter's rows and columns, so on zero1/zero2
# each unit's gradient is all-reduced and every rank updates whole parameters with the same
# states. Adafactor's per-tensor RMS amplifies f32 summation order (one device at batch 8 and as
# 2 micro-batches of 4 already differ in 5,335 elements beyond 1e-5), and N ranks sum as N
# micro-batches do: against one device with --micro-batches 2, 2 ranks are equal bit for bit. On
# 4 ranks MPI's all-reduce adds the 4 partial sums in its own order, so there the bound is that
# noise's: every element within 2e-3 of its tensor's largest value but 2 %, those within 2·lr
# per step (mostly the key biases, whose gradient is noise).
TAG=-mb2 COMMON="$COMMON $UNFUSED_MB 2" one_device fp32 adafactor
TAG=-mb2 COMMON="$COMMON $UNFUSED_MB 2" one_device bf16-mixed adafactor
TAG=-mb4 COMMON="$COMMON $UNFUSED_MB 4" one_device fp32 adafactor
TAG=-mb2 check_case 2 zero1 fp32 adafactor 0 0
TAG=-mb2 check_case 2 zero2 fp32 adafactor 0 0
TAG=-mb2 check_case 2 zero2 bf16-mixed adafactor 0 0
TAG=-mb4 check_case 4 zero2 fp32 adafactor 0.002 0.02 optimizer
# Micro-batches on each rank (its slice split again; zero3 and streaming gather every unit again
# per micro-batch). Dropout draws continue at the rank's first row in every micro-batch (before,
# ranks > 0 replayed rank 0's masks once a rank micro-batched).
MB=2
check_case 2 zero2 fp32 adamw 1e-5 0.0005
check_case 2 zero3 fp32 adamw 1e-5 0.0005
check_case 2 zero3 bf16-mixed adamw 0.00390625 0.01 params
MB=
# Unequal slices: 10 samples over 4 ranks are 3, 3, 2 and 2, and 9 over 2 are 5 and 4 (sizes
# differ by at most one). Every rank's step has the longer slice's rows; a short slice pads a
# row the loss ignores, and each rank's loss sum is divided by batch/devices, so the ranks' mean
# is the global batch's mean loss. Against one device at the same global batch.
TAG=-b10 COMMON="--batch 10 --lr 2e-3 --clip-grad-norm 1.0"
one_device fp32 momentum
one_device fp32 adamw
one_device bf16-mixed adamw
check_case 4 zero2 fp32 momentum 1e-5 0
check_case 4 zero3 fp32 adamw 1e-5 0.0005
check_case 4 zero1 bf16-mixed adamw 0.00390625 0.01
check_case 4 zero3 fp32 adamw 1e-5 0.0005 params
MB=2 check_case 4 zero3 fp32 adamw 1e-5 0.0005  # each rank's 3 rows as 2 + 1: a short rank's second micro-batch is all padding
TAG=-b9 COMMON="--batch 9 --lr 2e-3 --clip-grad-norm 1.0"
one_device fp32 adamw
check_case 2 zero2 fp32 adamw 1e-5 0.0005
MB=2 check_case 2 zero3 fp32 adamw 1e-5 0.0005  # 5 rows as 3 + 2; rank 1's padding row is in its second
TAG="" COMMON="--batch 8 --lr 2e-3 --clip-grad-norm 1.0"

# Parameter streaming on one device (--offload params): the same kernels on the same values, so
# the losses and the checkpoint are bit-identical to the plan without offload; only the memory
# spaces change, and the device peak drops. (Without clipping: global-norm clipping sums a
# streamed unit's squares in one flat pass, in another order than parameter by parameter.)
for p in fp32 bf16-mixed; do
  for off in none params; do
    d=$TMP/stream-$p-$off
    mkdir -p "$d"
    $MEMC compile models/$MODEL.onnx --batch 8 --lr 2e-3 --optimizer adamw --precision "$p" --offload $off -o "$d/plan" >/dev/null 2>"$TMP/err" \
      || fail "compile --offload $off $p: $(cat "$TMP/err")"
    $MEMC run "$d/plan" $DATA --steps 5 --quiet --checkpoint "$d/ckpt" --json "$d/r.json" >/dev/null 2>"$TMP/err" || fail "run --offload $off $p: $(cat "$TMP/err")"
  done
  a=$TMP/stream-$p-none b=$TMP/stream-$p-params
  same=$(python3 -c "$COMPARE" "$a/r.json" "$b/r.json" "$a/ckpt/checkpoint.safetensors" "$b/ckpt/checkpoint.safetensors" 0 adamw 0 2>&1) \
    && pass "one device, --offload params $p = no offload after 5 steps, bit for bit: $same" || fail "--offload params $p: $same"
  python3 -c '
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert b["measured_peak_bytes"] == b["predicted_peak_bytes"] < a["predicted_peak_bytes"], (a["predicted_peak_bytes"], b["measured_peak_bytes"], b["predicted_peak_bytes"])
print("%d bytes measured = planned, %d without offload" % (b["measured_peak_bytes"], a["predicted_peak_bytes"]))' "$a/r.json" "$b/r.json" >"$TMP/out" 2>&1 \
    && pass "--offload params $p device peak: $(cat "$TMP/out")" || fail "--offload params $p peak: $(cat "$TMP/out")"
done

# --dump-grads on a sharded or streamed plan: rank 0 writes the whole gradients of the global
# batch, per parameter, as one device computes them (within f32 summation order: 1e-5 of each
# tensor's largest value).
GRADS="$NPZ_PY"'
a, b = ({k: v[2] for k, v in read_npz(p).items()} for p in sys.argv[1:3])
assert sorted(a) == sorted(b), set(a) ^ set(b)
worst = 0.0
for k in a:
    scale = max(max(abs(v) for v in a[k]), 1e-6)
    worst = max(worst, max(abs(x - y) for x, y in zip(a[k], b[k])) / scale)
assert worst <= 1e-5, worst
print("%d arrays within %.2g" % (len(a), worst))
'
$MEMC run "$TMP/one-fp32-adamw/plan" $DATA --steps 1 --quiet --dump-grads "$TMP/g1.npz" >/dev/null 2>"$TMP/err" || fail "dump on one device: $(cat "$TMP/err")"
$MEMC run "$TMP/one-b10-fp32-adamw/plan" $DATA --steps 1 --quiet --dump-grads "$TMP/g1-b10.npz" >/dev/null 2>"$TMP/err" || fail "dump on one device: $(cat "$TMP/err")"
# (The gradients do not depend on the optimizer; adafactor's are all-reduced whole.)
for c in "2 zero1 none 8" "2 zero3 none 8" "4 zero3 params 8" "1 none params 8" "4 zero2 none 10" "4 zero3 none 10" "2 zero2 none 8 adafactor"; do
  set -- $c
  one=$TMP/g1.npz
  [ "$4" = 8 ] || one=$TMP/g1-b$4.npz
  $MEMC compile models/$MODEL.onnx --batch "$4" --lr 2e-3 --clip-grad-norm 1.0 --optimizer "${5:-adamw}" --devices "$1" --shard "$2" --offload "$3" -o "$TMP/g.plan" --force >/dev/null 2>"$TMP/err" \
    || { fail "compile $c: $(cat "$TMP/err")"; continue; }
  rm -f "$TMP/g.npz"
  ranks "$1" $MEMC run "$TMP/g.plan" $DATA --steps 1 --quiet --dump-grads "$TMP/g.npz" >/dev/null 2>"$TMP/err" || { fail "dump $c: $(tail -2 "$TMP/err")"; continue; }
  out=$(python3 -c "$GRADS" "$one" "$TMP/g.npz" 2>&1) && pass "--dump-grads, $1 rank(s) $2 offload $3 batch $4 ${5:-adamw} = one device: $out" || fail "--dump-grads $c: $out"
done
# ZeRO-3 under a budget just below its prefetching plan: the same decisions scheduled without the
# prefetch (passes/schedule.h drops it) train as one device does, measured = planned on each rank.
Z="--batch 8 --lr 2e-3 --clip-grad-norm 1.0 --devices 2 --shard zero3 --precision fp32 --micro-batches 1 --remat none --offload none"
$MEMC compile models/vit_tiny.onnx $Z --json -o "$TMP/zp.plan" --force -v >"$TMP/zp.json" 2>"$TMP/err" || fail "zero3 prefetching: $(cat "$TMP/err")"
grep -q "prefetch one unit ahead" "$TMP/err" || fail "zero3 without a budget does not prefetch: $(grep schedule "$TMP/err")"
ZP=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["predicted_peak_bytes"])' "$TMP/zp.json")
rm -f "$TMP/zd.npz"
$MEMC compile models/vit_tiny.onnx $Z --budget $((ZP - 1)) --json -o "$TMP/zd.plan" --force -v >"$TMP/zd.json" 2>"$TMP/err" \
  && grep -q "over the budget: scheduled without it" "$TMP/err" \
  && ranks 2 $MEMC run "$TMP/zd.plan" $DATA --steps 1 --quiet --dump-grads "$TMP/zd.npz" --json "$TMP/zd_run.json" >/dev/null 2>>"$TMP/err" \
  && out=$(python3 -c "$GRADS" "$TMP/g1.npz" "$TMP/zd.npz" 2>&1) && peaks=$(python3 -c "$PEAKS" "$TMP/zd_run.json" 2 2>&1) \
  && [ "${peaks%% *}" -lt "$ZP" ] \
  && pass "zero3 with its prefetch dropped under a budget of $((ZP - 1)) bytes: gradients = one device ($out), measured = planned ($peaks bytes)" \
  || fail "zero3 without prefetch: ${out:-} ${peaks:-} $(grep -E 'schedule|error|memc:' "$TMP/err" | tail -3)"
# A language model (models/gpt2_lm_ts_t215.onnx: logits and labels per position, -100 ignored,
# a tied embedding): each rank divides its sum by the global batch's kept positions (one
# all_reduce), and a short slice's padding row is all ignored positions.
LM="models/gpt2_lm_ts_t215.onnx --seq 32 --lr 2e-3"
for b in 8 10; do
  $MEMC compile $LM --batch $b -o "$TMP/lm1.plan" --force >/dev/null 2>"$TMP/err" || fail "compile lm b$b: $(cat "$TMP/err")"
  $MEMC run "$TMP/lm1.plan" --data data/lm_test.npz --steps 1 --quiet --dump-grads "$TMP/lm1-b$b.npz" >/dev/null 2>"$TMP/err" || fail "lm dump b$b: $(cat "$TMP/err")"
done
# The last case chunks the head and loss (--loss-chunks 3): each rank's chunks scale their
# gradients by the global count, and the head's weight is zero3's gathered copy.
for c in "4 zero2 10 1" "2 zero3 8 2" "4 zero3 10 1 3"; do
  set -- $c
  $MEMC compile $LM --batch "$3" --micro-batches "$4" --devices "$1" --shard "$2" --loss-chunks "${5:-none}" -o "$TMP/lm.plan" --force >/dev/null 2>"$TMP/err" \
    || { fail "compile lm $c: $(cat "$TMP/err")"; continue; }
  rm -f "$TMP/lm.npz"
  ranks "$1" $MEMC run "$TMP/lm.plan" --data data/lm_test.npz --steps 1 --quiet --dump-grads "$TMP/lm.npz" >/dev/null 2>"$TMP/err" || { fail "lm dump $c: $(tail -2 "$TMP/err")"; continue; }
  out=$(python3 -c "$GRADS" "$TMP/lm1-b$3.npz" "$TMP/lm.npz" 2>&1) && pass "language model, $1 ranks $2 batch $3 micro-batches $4 loss chunks ${5:-none} = one device: $out" || fail "lm $c: $out"
done
# The text model (token embeddings, attention mask input).
MODEL=text_encoder TAG=-text DATA="--data data/text_train.npz" COMMON="$COMMON --seq 32"
one_device fp32 adamw
check_case 2 zero2 fp32 adamw 1e-5 0.0005
check_case 2 zero3 fp32 adamw 1e-5 0.0005
# BatchNorm in train() (models/bn_net_train_t215.onnx): each rank's batch statistics are summed
# over the ranks (an all_reduce in the forward, as SyncBatchNorm), so the running statistics and
# weights equal one device's; an uneven split, whose padded row would enter them, is refused.
MODEL=bn_net_train_t215 TAG=-bn DATA="--data data/digits_train.npz" COMMON="--batch 8 --lr 2e-3 --clip-grad-norm 1.0"
one_device fp32 momentum
for stage in zero1 zero2 zero3; do check_case 2 $stage fp32 momentum 1e-5 0; done
check_case 4 zero3 fp32 momentum 1e-5 0
expect_error 2 "batch 9 does not split evenly over 2 ranks, and a padded row would enter the statistics" -- \
  $MEMC compile models/bn_net_train_t215.onnx --batch 9 --devices 2 -o "$TMP/bn9.plan"
MODEL=vit_tiny TAG="" DATA="--data data/digits_train.npz" COMMON="--batch 8 --lr 2e-3 --clip-grad-norm 1.0"

# Resume with another number of ranks: 2 ranks for 3 steps, then 1 rank (the one-device plan) and
# 4 ranks for the last 2, against the uninterrupted one-device losses.
$MEMC compile models/vit_tiny.onnx $COMMON --optimizer adamw --devices 2 --shard zero2 -o "$TMP/r2.plan" >/dev/null 2>&1
$MEMC compile models/vit_tiny.onnx $COMMON --optimizer adamw --devices 4 --shard zero3 -o "$TMP/r4.plan" >/dev/null 2>&1
ranks 2 $MEMC run "$TMP/r2.plan" $DATA --steps 3 --quiet --checkpoint "$TMP/resume" >/dev/null 2>"$TMP/err" || fail "2-rank start: $(tail -2 "$TMP/err")"
cp -r "$TMP/resume" "$TMP/resume4"
$MEMC run "$TMP/one-fp32-adamw/plan" $DATA --steps 2 --quiet --checkpoint "$TMP/resume" --resume --json "$TMP/res1.json" >/dev/null 2>"$TMP/err" \
  || fail "resume on 1: $(cat "$TMP/err")"
ranks 4 $MEMC run "$TMP/r4.plan" $DATA --steps 2 --quiet --checkpoint "$TMP/resume4" --resume --json "$TMP/res4.json" >/dev/null 2>"$TMP/err" \
  || fail "resume on 4: $(tail -2 "$TMP/err")"
for n in 1 4; do
  python3 -c '
import json, sys
full, res = json.load(open(sys.argv[1]))["losses"], json.load(open(sys.argv[2]))["losses"]
assert len(res) == 2, res
for a, b in zip(full[3:], res):
    assert abs(a - b) <= 1e-5 * abs(a), (full, res)
' "$TMP/one-fp32-adamw/r.json" "$TMP/res$n.json" && pass "2 ranks → $n rank(s) resumes the uninterrupted losses (steps 4-5)" \
    || fail "2 ranks → $n: losses $(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["losses"])' "$TMP/res$n.json")"
done

# The issue's chain: 4 ranks (zero3) for 2 steps, 2 ranks (zero2) for 2 more, then 1 rank for the
# last: each segment continues the uninterrupted one-device losses within 1e-5.
ranks 4 $MEMC run "$TMP/r4.plan" $DATA --steps 2 --quiet --checkpoint "$TMP/chain" --json "$TMP/c1.json" >/dev/null 2>"$TMP/err" || fail "chain on 4: $(tail -2 "$TMP/err")"
ranks 2 $MEMC run "$TMP/r2.plan" $DATA --steps 2 --quiet --checkpoint "$TMP/chain" --resume --json "$TMP/c2.json" >/dev/null 2>"$TMP/err" || fail "chain on 2: $(tail -2 "$TMP/err")"
$MEMC run "$TMP/one-fp32-adamw/plan" $DATA --steps 1 --quiet --checkpoint "$TMP/chain" --resume --json "$TMP/c3.json" >/dev/null 2>"$TMP/err" || fail "chain on 1: $(cat "$TMP/err")"
python3 -c '
import json, sys
full = json.load(open(sys.argv[1]))["losses"]
got = sum((json.load(open(p))["losses"] for p in sys.argv[2:]), [])
assert len(got) == 5, got
for a, b in zip(full, got):
    assert abs(a - b) <= 1e-5 * abs(a), (full, got)
print("max difference %.2g" % max(abs(a - b) for a, b in zip(full, got)))' "$TMP/one-fp32-adamw/r.json" "$TMP/c1.json" "$TMP/c2.json" "$TMP/c3.json" >"$TMP/out" 2>&1 \
  && pass "4 → 2 → 1 ranks (2 + 2 + 1 steps) reproduces the uninterrupted losses: $(cat "$TMP/out")" || fail "4 → 2 → 1 resume: $(cat "$TMP/out")"

# adam8bit's codes and block maxima move between layouts too: 4 ranks (zero3) for 2 steps, then
# one device for 3, against the uninterrupted one-device losses.
ranks 4 $MEMC run "$TMP/4-zero3-fp32-adam8bit-params/plan" $DATA --steps 2 --quiet --checkpoint "$TMP/chain8" >/dev/null 2>"$TMP/err" || fail "adam8bit chain on 4: $(tail -2 "$TMP/err")"
$MEMC run "$TMP/one-fp32-adam8bit/plan" $DATA --steps 3 --quiet --checkpoint "$TMP/chain8" --resume --json "$TMP/c8.json" >/dev/null 2>"$TMP/err" || fail "adam8bit chain on 1: $(cat "$TMP/err")"
python3 -c '
import json, sys
full, res = json.load(open(sys.argv[1]))["losses"], json.load(open(sys.argv[2]))["losses"]
assert len(res) == 3, res
for a, b in zip(full[2:], res):
    assert abs(a - b) <= 1e-5 * abs(a), (full, res)
print("max difference %.2g" % max(abs(a - b) for a, b in zip(full[2:], res)))' "$TMP/one-fp32-adam8bit/r.json" "$TMP/c8.json" >"$TMP/out" 2>&1 \
  && pass "adam8bit: 4 ranks (zero3, streamed) → 1 device resumes the uninterrupted losses: $(cat "$TMP/out")" || fail "adam8bit 4 → 1 resume: $(cat "$TMP/out")"

# Adafactor's replicated states resume too: 2 ranks (zero2) for 3 steps, then one device (as 2
# micro-batches) for 2, equal to the uninterrupted run.
ranks 2 $MEMC run "$TMP/2-mb2-zero2-fp32-adafactor-none/plan" $DATA --steps 3 --quiet --checkpoint "$TMP/chainf" >/dev/null 2>"$TMP/err" || fail "adafactor on 2: $(tail -2 "$TMP/err")"
$MEMC run "$TMP/one-mb2-fp32-adafactor/plan" $DATA --steps 2 --quiet --checkpoint "$TMP/chainf" --resume --json "$TMP/cf.json" >/dev/null 2>"$TMP/err" || fail "adafactor resume on 1: $(cat "$TMP/err")"
python3 -c '
import json, sys
full, res = json.load(open(sys.argv[1]))["losses"], json.load(open(sys.argv[2]))["losses"]
assert res == full[3:], (full, res)' "$TMP/one-mb2-fp32-adafactor/r.json" "$TMP/cf.json" 2>"$TMP/out" \
  && pass "adafactor: 2 ranks (zero2) → 1 device resumes the uninterrupted losses exactly" || fail "adafactor 2 → 1 resume: $(cat "$TMP/out")"

# A checkpoint written by sharded ranks is the one-device file: memc export reads it unchanged.
$MEMC export "$TMP/r4.plan" --weights "$TMP/resume4" -o "$TMP/trained.onnx" >/dev/null 2>"$TMP/err" \
  && pass "memc export reads the zero3 checkpoint of 4 ranks" || fail "export of a sharded checkpoint: $(cat "$TMP/err")"

# Planned at the edge (compile only): ViT-L/16 at batch 16, AdamW, bf16-mixed, on h200 with 4
# devices. zero3's backward regathers each unit (and recomputes its bf16 casts), so no copy of the
# weights lives from forward to backward: its peak is below zero2's by more than the 3/4 of the
# f32 parameters zero3 shards; with remat and the optimizer state offloaded it fits 1.0 GB.
LARGE="models/vit_l_16_skeleton.onnx --batch 16 --optimizer adamw --precision bf16-mixed --target h200 --devices 4"
peak_of() { "$MEMC" compile $LARGE "$@" -o "$TMP/l.plan" --force --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["predicted_peak_bytes"])'; }
z2=$(peak_of --shard zero2) z3=$(peak_of --shard zero3) edge=$(peak_of --shard zero3 --remat blocks --offload optimizer)
psi=304326632
[ -n "$z2" ] && [ -n "$z3" ] && [ $((z2 - z3)) -gt $((3 * psi)) ] && pass "ViT-L/16 on 4 devices: zero3 plans $z3 bytes, zero2 $z2" \
  || fail "ViT-L/16 on 4 devices: zero3 $z3, zero2 $z2 bytes"
[ -n "$edge" ] && [ "$edge" -le 1000000000 ] && pass "ViT-L/16 on 4 devices, zero3 + remat blocks + offload optimizer: $edge bytes <= 1.0 GB" \
  || fail "ViT-L/16 edge plan: $edge bytes"
# On one device the f32 weights alone (1.22 GB) do not fit 1.0 GB: streamed from the host, one
# unit at a time, they do. Under --budget 1GB the search finds a faster plan still: the optimizer
# (and the f32 masters) on the host, and checkpoints finer than the blocks (remat under a limit
# holds less than per-block checkpointing here: 929 MiB against 1.0 GiB).
LARGE="models/vit_l_16_skeleton.onnx --batch 16 --optimizer adamw --precision bf16-mixed --target h200"
one=$(peak_of --offload params --remat blocks)
[ -n "$one" ] && [ "$one" -le 1000000000 ] && pass "ViT-L/16 on 1 device, offload params + remat blocks: $one bytes <= 1.0 GB" \
  || fail "ViT-L/16 streamed: $one bytes"
"$MEMC" compile $LARGE --budget 1GB -o "$TMP/l.plan" --force --json >"$TMP/l.json" 2>"$TMP/err" || fail "ViT-L/16 search at 1 GB: $(cat "$TMP/err")"
python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["decisions"]["offload"] in ("optimizer", "params") and s["predicted_peak_bytes"] <= 10**9, (s["decisions"], s["predicted_peak_bytes"])
print("%s, %d bytes, search %.1f s" % (s["search"]["chosen"]["decisions"], s["predicted_peak_bytes"], s["search"]["search_seconds"]))' "$TMP/l.json" >"$TMP/out" 2>&1 \
  && pass "ViT-L/16 --budget 1GB on one device offloads: $(cat "$TMP/out")" || fail "ViT-L/16 search at 1 GB: $(cat "$TMP/out")"

# Prefetch: zero3's gathers are async pairs; on ViT-L/16 (4 × h200) the schedule keeps each
# unit's start a unit ahead of its done, with GEMMs of the unit before in between, forward and
# backward, and across passes (backward's first regather follows the forward's last unit; a
# micro-batch's first gather follows the previous one's last backward unit), so only the
# step's first start follows nothing.
GATHERS='
import re, sys
lines = open(sys.argv[1]).read().splitlines()
start, overlapped, pairs, alone = {}, 0, 0, 0
for i, l in enumerate(lines):
    m = re.match(r"\s*(%\S+) = \"memc.all_gather_start\"\(([^)]*)\)", l)
    if m:
        start[m.group(1)] = i
        alone += "," not in m.group(2)  # no `after` input: nothing to follow
    m = re.match(r"\s*%\S+ = \"memc.all_gather_done\"\((%[^,]+),", l)
    if m:
        pairs += 1
        overlapped += any("\"memc.linear\"" in x for x in lines[start[m.group(1)]:i])
want_pairs, want_overlapped = int(sys.argv[2]), int(sys.argv[3])
assert pairs == want_pairs and overlapped >= want_overlapped and alone == 1, (pairs, overlapped, alone)
print("%d of %d gathers in flight across GEMMs, %d start follows nothing" % (overlapped, pairs, alone))'
"$MEMC" compile $LARGE --devices 4 --shard zero3 -o "$TMP/l.plan" --force -v --print-ir-after schedule >/dev/null 2>"$TMP/ir"
# 26 forward, 25 backward (the embedding is not re-read); the step's first and the embedding's
# (its unit has no GEMM) are the two not across a GEMM.
python3 -c "$GATHERS" "$TMP/ir" 51 49 >"$TMP/out" 2>&1 && grep -q "prefetch one unit ahead" "$TMP/ir" \
  && pass "ViT-L/16 zero3 on 4 devices prefetches: $(cat "$TMP/out")" || fail "prefetch: $(cat "$TMP/out"; grep schedule "$TMP/ir" | head -3)"
# With 4 micro-batches: each micro-batch gathers a unit right before its first reader (not all
# units up front) and prefetches across micro-batches, so its peak is below one micro-batch's
# (it was 2,526,489,088 bytes when every unit was gathered first; 1 micro-batch: 1,863,408,256).
"$MEMC" compile $LARGE --devices 4 --shard zero3 -o "$TMP/l1.plan" --force >"$TMP/one" 2>&1
"$MEMC" compile $LARGE --devices 4 --shard zero3 --micro-batches 4 -o "$TMP/l.plan" --force -v --print-ir-after schedule >"$TMP/four" 2>"$TMP/ir"
one=$(sed -n 's/^memory .*(\([0-9,]*\) bytes).*/\1/p' "$TMP/one" | tr -d ,)
four=$(sed -n 's/^memory .*(\([0-9,]*\) bytes).*/\1/p' "$TMP/four" | tr -d ,)
python3 -c "$GATHERS" "$TMP/ir" 204 199 >"$TMP/out" 2>&1 && grep -q "prefetch one unit ahead" "$TMP/ir" && [ -n "$four" ] && [ "$four" -lt "$one" ] \
  && pass "ViT-L/16 zero3 on 4 devices, 4 micro-batches: $(cat "$TMP/out"); planned $four bytes < $one at 1 micro-batch" \
  || fail "zero3 with micro-batches: $(cat "$TMP/out"; grep schedule "$TMP/ir" | head -3); peaks $four (4 micro-batches) vs $one"
# With remat and offload the prefetching order costs less than a unit each way over the best
# order without it, so it is kept: planned for the CPU (where it was dropped while the step still
# ran the 23 forward linears whose results remat's recompute replaced: bench/journal/2026.md §60)
# and on the h200 target, where each bias gradient rides in its weight gradient's GEMM.
"$MEMC" compile ${LARGE/--target h200/--target cpu} --devices 4 --shard zero3 --remat blocks --offload optimizer -o "$TMP/l.plan" --force -v >/dev/null 2>"$TMP/err"
grep -q "prefetch one unit ahead" "$TMP/err" && pass "with remat and offload the prefetch is kept on the CPU: $(grep -o 'prefetch one unit ahead.*' "$TMP/err")" \
  || fail "prefetch under remat: $(grep schedule "$TMP/err")"
"$MEMC" compile $LARGE --devices 4 --shard zero3 --remat blocks --offload optimizer -o "$TMP/l.plan" --force -v >/dev/null 2>"$TMP/err"
grep -q "bias_grad_gemm: [1-9]" "$TMP/err" && grep -q "prefetch one unit ahead" "$TMP/err" \
  && pass "with remat and offload on h200 the prefetch is kept: $(grep -o 'prefetch one unit ahead.*' "$TMP/err")" \
  || fail "prefetch under remat on h200: $(grep -E 'schedule|bias_grad' "$TMP/err")"

# Gradient reductions overlap too: each unit's reduce-scatter (zero2, zero3) starts as soon as
# its gradient exists, and the unit before computes (GEMMs) while it is in flight. A
# memory-first order would start it right before its done, hiding nothing (the estimate for
# GPT-3-6.7B dims on 8 × h200 was 338.6 ms with 73.4 ms exposed that way; 275.2 / 10.0 ms now).
REDUCTIONS='
import re, sys
lines = open(sys.argv[1]).read().splitlines()
start, overlapped, pairs = {}, 0, 0
for i, l in enumerate(lines):
    m = re.match(r"\s*(%\S+) = \"memc.(reduce_scatter|all_reduce)_start\"", l)
    if m:
        start[m.group(1)] = i
    m = re.match(r"\s*%\S+ = \"memc.(reduce_scatter|all_reduce)_done\"\((%[^,)]+)", l)
    if m and m.group(2) in start:
        pairs += 1
        overlapped += any("\"memc.linear\"" in x or "\"memc.matmul\"" in x for x in lines[start[m.group(2)]:i])
want_pairs, want_overlapped = int(sys.argv[2]), int(sys.argv[3])
assert pairs == want_pairs and overlapped >= want_overlapped, (pairs, overlapped)
print("%d of %d gradient reductions in flight across GEMMs" % (overlapped, pairs))'
for stage in zero2 zero3; do
  "$MEMC" compile $LARGE --devices 4 --shard $stage -o "$TMP/l.plan" --force --print-ir-after schedule >/dev/null 2>"$TMP/ir"
  python3 -c "$REDUCTIONS" "$TMP/ir" 26 24 >"$TMP/out" 2>&1 \
    && pass "ViT-L/16 $stage on 4 devices: $(cat "$TMP/out")" || fail "$stage reductions: $(cat "$TMP/out")"
done

# The budget search over shard stages: a per-device budget, the plan fits it and runs as 2 ranks.
$MEMC compile models/vit_tiny.onnx --batch 8 --optimizer adamw --devices 2 --budget 400KB -o "$TMP/s.plan" --json >"$TMP/s.json" 2>"$TMP/err" \
  || fail "search over shard stages: $(cat "$TMP/err")"
python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["devices"] == 2 and s["decisions"]["shard"] in (1, 2, 3) and s["predicted_peak_bytes"] <= 400000, s["decisions"]
# The sharding rungs: every stage answered (its own search), and the chosen one is the plan.
rungs = s["search"]["shard_rungs"]
assert [r["shard"] for r in rungs] == ["zero1", "zero2", "zero3"], rungs
assert all(r["fits"] and r["planned_peak_bytes"] <= 400000 for r in rungs), rungs
chosen = [r for r in rungs if r["chosen"]]
assert len(chosen) == 1 and chosen[0]["shard"] == ["none", "zero1", "zero2", "zero3"][s["decisions"]["shard"]], rungs
print("shard stage %d, %d bytes; rungs %s" % (s["decisions"]["shard"], s["predicted_peak_bytes"], ", ".join("%s %d" % (r["shard"], r["planned_peak_bytes"]) for r in rungs)))' "$TMP/s.json" >"$TMP/out" 2>&1 \
  && pass "--devices 2 --budget 400KB searches the shard stages: $(cat "$TMP/out")" || fail "shard search: $(cat "$TMP/out")"
$MEMC compile models/vit_tiny.onnx --batch 8 --optimizer adamw --devices 2 --explain -o "$TMP/e.plan" >"$TMP/out" 2>"$TMP/err"
[ "$(sed -n '/^sharding/,/^pareto/p' "$TMP/out" | grep -c 'over 2 devices')" = 3 ] && grep -q 'zero3 over 2 devices' "$TMP/out" \
  && pass "--explain --devices 2 shows a rung per shard stage" || fail "--explain sharding rungs: $(cat "$TMP/out" "$TMP/err" | head -20)"
ranks 2 $MEMC run "$TMP/s.plan" $DATA --steps 2 --quiet --json "$TMP/s_run.json" >/dev/null 2>"$TMP/err" \
  && python3 -c "$PEAKS" "$TMP/s_run.json" 2 >/dev/null && pass "the searched plan runs as 2 ranks, measured = planned" || fail "searched plan run: $(tail -2 "$TMP/err")"

# An export that fixes its batch (bert_t215: 4) searched on 2 ranks at the global batch 8: the
# search reads the fixed batch at the rank's batch and offers no micro-batches (it refused
# "batch 8 cannot be used" before).
$MEMC compile models/bert_t215.onnx --batch 8 --devices 2 --budget 10GB -o "$TMP/fb.plan" --json >"$TMP/fb.json" 2>"$TMP/err" \
  && python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))["decisions"]; assert d["micro_batches"] == 1 and d["shard"] > 0, d' "$TMP/fb.json" \
  && pass "a fixed-batch export (4 per rank) searched on 2 ranks at batch 8" || fail "fixed-batch search on 2 ranks: $(tail -1 "$TMP/err")"

# memc calibrate under mpirun measures the collectives too (MPI over loopback): rank 0 writes a
# profile with their latency and bandwidth, and a sharded compile charges its collectives by it.
ranks 2 $MEMC calibrate -o "$TMP/prof.json" --seconds 0.05 >"$TMP/out" 2>"$TMP/err" || fail "calibrate on 2 ranks: $(tail -2 "$TMP/err")"
python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))
assert 0 < p["comm_latency_s"] < 1e-2 and 1e7 < p["comm_bandwidth"] < 1e12, p
print("%.1f us, %.2f GB/s" % (p["comm_latency_s"] * 1e6, p["comm_bandwidth"] / 1e9))' "$TMP/prof.json" >"$TMP/p.out" 2>&1 \
  && grep -q "^collectives 2 ranks over mpi" "$TMP/out" && pass "calibrate on 2 ranks measures MPI loopback collectives: $(cat "$TMP/p.out")" \
  || fail "calibrate collectives: $(cat "$TMP/p.out" "$TMP/out")"
$MEMC compile models/vit_tiny.onnx --batch 8 --devices 2 --shard zero2 --target "$TMP/prof.json" -o "$TMP/cal.plan" --json >"$TMP/cal.json" 2>"$TMP/err" \
  && pass "a sharded plan estimated with the calibrated profile" || fail "compile --target calibrated: $(cat "$TMP/err")"

# Wrong job sizes.
expect_error 2 "mpirun -np 2" -- $MEMC run "$TMP/r2.plan" $DATA --steps 1 --quiet
ranks 2 $MEMC run "$TMP/one-fp32-adamw/plan" $DATA --steps 1 --quiet >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "compile with --devices 2" "$TMP/err" && pass "a one-device plan as 2 ranks: exit 2, $(head -1 "$TMP/err")" \
  || fail "one-device plan on 2 ranks: exit $rc, $(head -3 "$TMP/err")"
expect_error 2 "--batch 3 is smaller than --devices 4" -- $MEMC compile models/vit_tiny.onnx --batch 3 --devices 4 -o "$TMP/x.plan"
expect_error 2 "use --shard zero3" -- $MEMC compile models/vit_tiny.onnx --batch 8 --devices 2 --shard zero2 --offload params -o "$TMP/x.plan"
expect_error 2 "--offload params needs an optimizer whose states work on flat units" -- $MEMC compile models/vit_tiny.onnx --batch 8 --offload params --optimizer adafactor -o "$TMP/x.plan"
expect_error 2 "--shard zero3 needs an optimizer whose states work on flat units" -- $MEMC compile models/vit_tiny.onnx --batch 8 --devices 2 --shard zero3 --optimizer adafactor -o "$TMP/x.plan"
finish
