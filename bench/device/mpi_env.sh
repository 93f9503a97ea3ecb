# Sourced by the device scripts: Open MPI from the bundle (scripts/device_deps.sh packs Debian's
# under mpi/, since the device image has none), relocated. Needs $root (the unpacked bundle).
# Defines mpirun_local (the command, without -np) and `ranks NP COMMAND...`: NP ranks on this
# machine, started as tests/comm/mpirun.sh starts them.
mpi_root=$root/mpi
export OPAL_PREFIX=$mpi_root/usr
export PMIX_MCA_mca_base_component_path=$mpi_root/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix
export OMPI_MCA_mca_base_component_show_load_errors=0  # plugins for fabrics this machine lacks
export LD_LIBRARY_PATH=$mpi_root/lib:$mpi_root/usr/lib/x86_64-linux-gnu/openmpi/lib:${LD_LIBRARY_PATH:-}
export PATH=$mpi_root/usr/bin:$PATH
mpirun_local=("$mpi_root/usr/bin/orterun" --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader
  --mca btl_vader_single_copy_mechanism none --mca oob_tcp_if_include lo)  # local ranks inherit the environment
ranks() { "${mpirun_local[@]}" -np "$1" "${@:2}"; }
