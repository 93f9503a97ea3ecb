# Helpers sourced by tests/cli/*.sh (this file is not a test: it does not end in .sh).
# Usage in a script:  source "$(dirname "$0")/common.bash" "$@"
set -uo pipefail
MEMC=$(realpath "$1")
SRC=$(realpath "$2")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
failures=0

fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
finish() {
  if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed" >&2; exit 1; fi
  echo "all checks passed"
}

# expect_error CODE NEEDLE -- CMD...: exit status CODE, exactly one stderr line starting with
# "memc: " and containing NEEDLE, nothing on stdout.
expect_error() {
  local code=$1 needle=$2; shift 3
  "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$? lines
  lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ne "$code" ]; then fail "$* -> exit $rc, want $code ($(head -c 300 "$TMP/err"))"; return; fi
  if [ "$lines" -ne 1 ]; then fail "$* -> $lines stderr lines, want 1: $(head -c 600 "$TMP/err")"; return; fi
  if ! grep -q '^memc: ' "$TMP/err"; then fail "$* -> stderr does not start with 'memc: ': $(cat "$TMP/err")"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "$* -> stderr lacks '$needle': $(cat "$TMP/err")"; return; fi
  if [ -s "$TMP/out" ]; then fail "$* -> wrote to stdout on error: $(head -c 300 "$TMP/out")"; return; fi
  pass "$* -> $code: $(cat "$TMP/err")"
}

# NumPy .npz I/O with the standard library only (the system python3 may lack numpy).
NPZ_PY='
import ast, struct, sys, zipfile
CODES = {"<f4": "f", "<f8": "d", "<i8": "q", "<i4": "i", "|b1": "?", "|u1": "B"}
def read_npz(path):
    out = {}
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            b = z.read(name)
            assert b[:6] == b"\x93NUMPY", name
            n, off = (struct.unpack("<H", b[8:10])[0], 10) if b[6] == 1 else (struct.unpack("<I", b[8:12])[0], 12)
            h = ast.literal_eval(b[off:off + n].decode("latin1"))
            count = 1
            for d in h["shape"]: count *= d
            vals = struct.unpack("<%d%s" % (count, CODES[h["descr"]]), b[off + n:])
            out[name[:-4] if name.endswith(".npy") else name] = (h["descr"], tuple(h["shape"]), vals)
    return out
def npy(descr, shape, vals):
    d = "{%r: %r, %r: False, %r: %s, }" % ("descr", descr, "fortran_order", "shape",
                                           "(%s)" % "".join("%d," % s for s in shape))
    total = (10 + len(d) + 1 + 63) // 64 * 64
    d = d + " " * (total - 10 - len(d) - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(d)) + d.encode() + struct.pack("<%d%s" % (len(vals), CODES[descr]), *vals)
def write_npz(path, arrays):
    with zipfile.ZipFile(path, "w") as z:
        for k, (descr, shape, vals) in arrays.items():
            z.writestr(k + ".npy", npy(descr, shape, vals))
def rel_error(a, b):
    m = max(abs(v) for v in b)
    return max(abs(x - y) for x, y in zip(a, b)) / (m if m else 1.0)
'
npz_py() { python3 -c "$NPZ_PY
$1" "${@:2}"; }

# hostile CODE NEEDLE -- CMD...: expect_error with a 60 s hang timeout, and never a signal
# exit (>= 128), for the hostile-input suites (tests/cli/hostile_*.sh).
hostile() {
  local code=$1 needle=$2; shift 3
  timeout -s KILL 60 "$@" >"$TMP/out" 2>"$TMP/err"
  local rc=$? lines
  lines=$(wc -l <"$TMP/err")
  if [ "$rc" -ge 124 ]; then fail "$* -> exit $rc (signal or hang): $(head -c 300 "$TMP/err")"; return; fi
  if [ "$rc" -ne "$code" ]; then fail "$* -> exit $rc, want $code ($(head -c 300 "$TMP/err"))"; return; fi
  if [ "$lines" -ne 1 ]; then fail "$* -> $lines stderr lines, want 1: $(head -c 600 "$TMP/err")"; return; fi
  if ! grep -q '^memc: ' "$TMP/err"; then fail "$* -> stderr does not start with 'memc: ': $(cat "$TMP/err")"; return; fi
  if ! grep -qF -- "$needle" "$TMP/err"; then fail "$* -> stderr lacks '$needle': $(cat "$TMP/err")"; return; fi
  pass "$* -> $code: $(cat "$TMP/err")"
}

# snapshot DIR...: one line per file (sha256 and path) under the given folders, to compare
# before and after a command that must change nothing that existed.
snapshot() { find "$@" -type f ! -name '.memc.lock' -print0 2>/dev/null | sort -z | xargs -0 -r sha256sum; }
