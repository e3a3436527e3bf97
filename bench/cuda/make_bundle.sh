#!/bin/bash
# Puts the MPI side of the GPU bundle into DIR (default .device): Debian 12's Open MPI 4.1.4
# runtime (libraries, the MCA plugins an isolated singleton opens, help files), the pre-flight
# bin/mpitest and the one-process stand-in lib/stubmpi/libmpi.so.40, so that run.sh needs
# nothing installed on the GPU machine. NCCL and cuBLAS are not bundled (218 MB and 600 MB):
# run.sh finds them there. Needs this machine's Open MPI (libopenmpi-dev, mpicc) and gcc.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
B="${1:-.device}"
mkdir -p "$B"
B="$(cd "$B" && pwd)"
L=/lib/x86_64-linux-gnu
P=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
rm -rf "$B/lib/openmpi3" "$B/share/openmpi"
mkdir -p "$B/lib/openmpi3" "$B/share/openmpi" "$B/lib/hwloc-none" "$B/lib/stubmpi" "$B/bin" "$B/etc"
# libmpi and what it loads that a bare CUDA image may lack.
for f in libmpi.so.40 libopen-rte.so.40 libopen-pal.so.40 libhwloc.so.15 libevent_core-2.1.so.7 \
  libevent_pthreads-2.1.so.7 libudev.so.1 libz.so.1 libmca_common_sm.so.40 \
  libmca_common_monitoring.so.50 libnuma.so.1; do
  cp -L "$L/$f" "$B/lib/"
done
# The components Open MPI opens as an isolated singleton (found with LD_DEBUG=files), less the PSM
# transports (their libraries are not bundled) and TCP/netlink (one process needs no network).
for c in allocator_basic allocator_bucket bml_r2 btl_self btl_sm btl_vader coll_adapt coll_basic \
  coll_han coll_inter coll_libnbc coll_monitoring coll_self coll_sm coll_sync coll_tuned \
  errmgr_default_app errmgr_default_hnp errmgr_default_orted errmgr_default_tool \
  ess_singleton mpool_hugepage op_avx osc_monitoring osc_rdma osc_sm pmix_isolated pml_cm \
  pml_monitoring pml_ob1 rcache_grdma reachable_weighted schizo_flux schizo_jsm schizo_ompi \
  schizo_orte schizo_slurm shmem_mmap shmem_posix shmem_sysv state_app state_hnp state_novm \
  state_orted state_tool vprotocol_pessimist; do
  cp "$P/mca_$c.so" "$B/lib/openmpi3/"
done
cp /usr/share/openmpi/help-*.txt "$B/share/openmpi/"
cp /etc/openmpi/openmpi-mca-params.conf "$B/etc/" 2>/dev/null || : >"$B/etc/openmpi-mca-params.conf"
# The pre-flight (the programs' MPI calls without CUDA) and the stand-in run.sh falls back to.
mpicc -O2 -o "$B/bin/mpitest" "$here/mpitest.c"
gcc -O2 -shared -fPIC -Wl,-soname,libmpi.so.40 -o "$B/lib/stubmpi/libmpi.so.40" "$here/stubmpi.c"
