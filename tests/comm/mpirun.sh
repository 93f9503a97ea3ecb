#!/usr/bin/env bash
# Runs a command as NP MPI ranks on this machine, with the flags a container needs:
#   --allow-run-as-root         OpenMPI refuses root without it
#   --oversubscribe --bind-to none   more ranks than cores (2-core machines), no pinning
#   --mca btl self,vader        shared memory between ranks, no network interface needed
#   --mca btl_vader_single_copy_mechanism none   no CMA (ptrace is often blocked in containers)
#   --mca oob_tcp_if_include lo  the launcher's own channel over loopback only
# Usage: tests/comm/mpirun.sh NP COMMAND [ARGS...]
set -euo pipefail
np=$1; shift
command -v mpirun > /dev/null || { echo "SKIP: no mpirun (apt-get install openmpi-bin)"; exit 77; }
# Sanitizer builds: OpenMPI keeps some allocations until exit; suppress those, not memc's. The
# suppressions match by library, so OpenMPI's plugins stay loaded (no dlclose) and leak stacks
# are unwound fully through its frame-pointer-less code.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp:fast_unwind_on_malloc=0:print_suppressions=0}
export OMPI_MCA_mca_base_component_disable_dlclose=1
exec mpirun --allow-run-as-root --oversubscribe --bind-to none \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none --mca oob_tcp_if_include lo \
  -np "$np" "$@"
