#!/usr/bin/env bash
# Prepares .devdeps/ (git-ignored) for bench/device_check.sh on a lent GPU machine. That machine
# has the CUDA toolkit, CMake and Python with PyTorch, but no package registry and none of memc's
# other dependencies (protobuf, ONNX, oneDNN, OpenBLAS, OpenMPI, GoogleTest), so memc and the CUDA
# test binaries are built here, stripped, and packed with the shared libraries they load beyond
# the C runtime and CUDA's own: .devdeps/memc-device.tar.xz (about 30 MB; the tool carries 64 MiB).
# The machine's C runtime is newer than Debian 12's (Python 3.12 there), so these binaries run.
#
# Here:    scripts/device_deps.sh [BUILD_DIR]       (default build/)
# Device:  run(command="bash bench/device_check.sh", carry=[".devdeps"], timeout_s=540)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
targets=(memc cuda_ops_host_test cuda_backend_test)
modules=(memc_cuda)  # libmemc_cuda.so: memc opens it with dlopen (backends/cuda_module.h), so ldd misses it
grep -q "^build cudnn_sdpa_test:" "$build/build.ninja" && targets+=(cudnn_sdpa_test)
grep -q "^build tests/comm_nccl_test:" "$build/build.ninja" && targets+=(comm_nccl_test)  # NCCL's own checks on GPU ranks (multi_gpu.sh)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" "${modules[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
strip -o "$stage/bin/memc" "$build/memc"
for t in "${targets[@]:1}"; do strip -o "$stage/bin/$t" "$build/tests/$t"; done
strip -o "$stage/lib/libmemc_cuda.so" "$build/libmemc_cuda.so"  # beside libmemc.so, where memc looks for it
# Everything they load but glibc, the GCC runtime (the machine's are newer) and CUDA's libraries
# and NCCL (the machine's toolkit and its PyTorch wheels bring those).
skip='/(libc|libm|libmvec|libstdc\+\+|libgcc_s|ld-linux-x86-64|libpthread|libdl|librt|libcuda|libcudart|libcublas|libcublasLt|libcudnn[a-z_]*|libnvrtc[a-z-]*|libnccl)\.so'
ldd "$stage"/bin/* "$stage"/lib/libmemc_cuda.so | awk '/=> \// {print $3}' | sort -u | grep -v -E "$skip" | while read -r lib; do cp -L "$lib" "$stage/lib/"; done
strip "$stage/lib/libmemc.so"  # built with debug info; the dynamic symbols the module needs stay
# Open MPI for GPU ranks (bench/device/multi_gpu.sh): the device image has none. Debian's
# mpirun, its plugins, PMIx and their help files, relocated under mpi/ (bench/device/mpi_env.sh
# points OPAL_PREFIX and PMIx there); the libraries memc itself links are in lib/ already.
# Checked here with the system's Open MPI hidden (`unshare -m`, its files bind-mounted away).
mpi=$stage/mpi/usr
mkdir -p "$mpi/bin" "$mpi/lib/x86_64-linux-gnu" "$mpi/share" "$stage/mpi/lib"
cp -L /usr/bin/orterun /usr/bin/orted "$mpi/bin/"
cp -a /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 "$mpi/lib/x86_64-linux-gnu/"
rm -rf "$mpi/lib/x86_64-linux-gnu/openmpi/include" "$mpi/lib/x86_64-linux-gnu/pmix2/include"
cp -a /usr/share/openmpi "$mpi/share/"
for l in libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 libhwloc.so.15 libevent_core-2.1.so.7 libevent_pthreads-2.1.so.7 \
         libevent-2.1.so.7 libudev.so.1 libmca_common_sm.so.40 libmca_common_monitoring.so.50 libmca_common_ompio.so.41 \
         libnuma.so.1 libuuid.so.1 libatomic.so.1; do
  cp -L "/usr/lib/x86_64-linux-gnu/$l" "$stage/mpi/lib/"
done
cp -L /usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2 "$stage/mpi/lib/"
git rev-parse HEAD >"$stage/COMMIT"
mkdir -p .devdeps
tar -cJf .devdeps/memc-device.tar.xz.tmp -C "$stage" COMMIT bin lib mpi
mv .devdeps/memc-device.tar.xz.tmp .devdeps/memc-device.tar.xz
echo "device_deps.sh: .devdeps/memc-device.tar.xz ($(du -h .devdeps/memc-device.tar.xz | cut -f1)): ${targets[*]}, $(ls "$stage/lib" | wc -l) libraries"
