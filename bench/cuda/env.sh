# Sourced by run.sh: the bundled Open MPI 4.1.4 as an isolated singleton (no orted, no mpirun).
# shellcheck shell=bash
# B must be the bundle folder (.device). The OPAL_* overrides point the relocated install at the
# bundle, since its compiled-in prefix (/usr) holds no Open MPI on the GPU machine.
export OPAL_PREFIX="$B" OPAL_EXEC_PREFIX="$B" OPAL_BINDIR="$B/bin" OPAL_LIBDIR="$B/lib" \
  OPAL_DATAROOTDIR="$B/share" OPAL_DATADIR="$B/share" OPAL_PKGDATADIR="$B/share/openmpi" \
  OPAL_PKGLIBDIR="$B/lib/openmpi3" OPAL_SYSCONFDIR="$B/etc"
export OMPI_MCA_mca_base_component_path="$B/lib/openmpi3"
export OMPI_MCA_mca_base_param_files="$B/etc/openmpi-mca-params.conf"
# A singleton that starts no orted daemon; one process needs only the self transport.
export OMPI_MCA_ess_singleton_isolated=1
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self
# Device machines run commands as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# An empty plugin folder: hwloc loads none of the plugins it was built with (not bundled).
export HWLOC_PLUGINS_PATH="$B/lib/hwloc-none"
