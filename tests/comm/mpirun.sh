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
exec mpirun --allow-run-as-root --oversubscribe --bind-to none \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none --mca oob_tcp_if_include lo \
  -np "$np" "$@"
