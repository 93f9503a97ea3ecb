#!/usr/bin/env bash
# Checks that MLIR itself accepts memc's text form: the hand-written fixture and the every-op
# module from ir_test go through `mlir-opt --allow-unregistered-dialect`. Needs MLIR >= 16
# (array<i64: ...> attributes); Debian: apt-get install mlir-16-tools. Exits 77 (skip) without it.
# Usage: tests/ir_mlir_test.sh [path/to/ir_test]
set -euo pipefail
ir_test=${1:-build/tests/ir_test}
mlir_opt=""
for candidate in "$(command -v mlir-opt || true)" $(ls -d /usr/lib/llvm-*/bin/mlir-opt 2>/dev/null | sort -V -r); do
  [ -x "$candidate" ] || continue
  major=$("$candidate" --version 2>/dev/null | sed -n 's/.*LLVM version \([0-9]*\).*/\1/p' | head -1)
  if [ "${major:-0}" -ge 16 ]; then mlir_opt=$candidate; break; fi
done
if [ -z "$mlir_opt" ]; then echo "SKIP: no mlir-opt >= 16 installed"; exit 77; fi

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
MEMC_IR_DUMP_DIR=$dir "$ir_test" --gtest_filter='IrText.FixtureRoundTripsByteForByte:IrText.EveryRegisteredOpRoundTrips' > "$dir/gtest.log" \
  || { cat "$dir/gtest.log"; exit 1; }
for f in fixture.mlir all_ops.mlir; do
  [ -s "$dir/$f" ] || { echo "FAIL: ir_test wrote no $f"; exit 1; }
  if ! "$mlir_opt" --allow-unregistered-dialect "$dir/$f" -o "$dir/$f.out" 2> "$dir/$f.err"; then
    echo "FAIL: $mlir_opt rejects $f:"; cat "$dir/$f.err"; exit 1
  fi
  echo "ok: $mlir_opt parses $f ($(grep -c '"memc\.' "$dir/$f") memc ops)"
done
