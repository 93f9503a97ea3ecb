# No #include points up the layers (README "Layout"; issue 16). A folder may include its own
# headers and those of any lower layer; one line per violation: `file:line: from -> to (why)`.
#   bash tests/cli/layers.sh [MEMC SRC]   (ctest passes the memc binary, unused here, and SRC)
set -uo pipefail
SRC=$(realpath "${2:-$(dirname "$0")/../..}")
cd "$SRC" || exit 1

# Lowest first. The pipeline runs frontend → passes → planner → runtime → tools; every stage
# builds on the IR, backends (kernels behind the Backend seam) use only ir and support, and the
# collectives' kernels call the Communicator, so backends/comm sits under the other backends.
declare -A RANK=(
  [support]=0 [ir]=1 [backends/comm]=2 [backends]=3 [backends/cpu]=3 [backends/cuda]=3
  [frontend]=4 [passes]=5 [planner]=6 [runtime]=7 [tools]=8 [python]=9 [tests]=9
)
# Sibling backends implement one interface and never reach into each other.
declare -A SIBLINGS=([backends/cpu]=1 [backends/cuda]=1)

# Known arrows up the layers, "file -> header", each with the reason it stays for now. Keyed
# without line numbers so edits elsewhere in the file do not move them; a stale entry fails.
declare -A ALLOWED=(
  # None at present. (The last, planner/compile.h -> runtime/plan.h, went when the Plan type
  # moved to planner/plan.h: the planner fills it, runtime/plan.h reads and writes it.)
)

# The layer of a repository path, in REPLY: its folder, or folder/subfolder under backends/.
layer_of() {
  local top=${1%%/*} rest=${1#*/}
  if [ "$top" = backends ] && [ "$rest" != "${rest#*/}" ]; then REPLY="backends/${rest%%/*}"; else REPLY=$top; fi
}

violations=0
declare -A USED=()
report() { echo "$1"; violations=$((violations + 1)); }

scanned=0
while IFS= read -r hit; do
  scanned=$((scanned + 1))
  file=${hit%%:*}; hit=${hit#*:}; line=${hit%%:*}
  [[ ${hit#*:} =~ \"([^\"]+)\" ]] || continue
  header=${BASH_REMATCH[1]}
  [ -d "${header%%/*}" ] || continue  # not a repository path: onnx/…, google/…
  layer_of "$file"; from=$REPLY
  layer_of "$header"; to=$REPLY
  [ "$from" = "$to" ] && continue
  if [ -z "${RANK[$to]+x}" ]; then report "$file:$line: $from -> $to (folder $to has no layer: add it to RANK in tests/cli/layers.sh)"; continue; fi
  why=""
  if [ "${RANK[$to]}" -gt "${RANK[$from]}" ]; then why="up the layers"
  elif [ -n "${SIBLINGS[$from]+x}" ] && [ -n "${SIBLINGS[$to]+x}" ]; then why="from one backend into another"
  fi
  [ -z "$why" ] && continue
  if [ -n "${ALLOWED["$file -> $header"]+x}" ]; then USED["$file -> $header"]=1; continue; fi
  report "$file:$line: $from -> $to ($why)"
done < <(grep -rnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' \
           --include='*.h' --include='*.hpp' --include='*.cc' --include='*.cpp' --include='*.cu' --include='*.cuh' \
           $(printf '%s\n' "${!RANK[@]}" | cut -d/ -f1 | sort -u) | sort -t: -k1,1 -k2,2n)

[ "$scanned" -gt 0 ] || report "no #include \"...\" found under $SRC: wrong source folder?"
for entry in "${!ALLOWED[@]}"; do
  [ -n "${USED["$entry"]+x}" ] || report "allow-list entry no longer needed: $entry (remove it from tests/cli/layers.sh)"
done

if [ "$violations" -ne 0 ]; then echo "$violations include(s) against the layers" >&2; exit 1; fi
echo "layers: $scanned includes, none up the layers (${#USED[@]} allowed, listed in tests/cli/layers.sh)"
