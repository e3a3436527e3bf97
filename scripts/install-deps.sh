#!/usr/bin/env bash
# Installs the Debian packages tandem builds and tests with; idempotent and non-interactive.
# Skips apt entirely when everything is present; uses sudo only when not already root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

packages=(
  cmake ninja-build g++ make pkg-config   # build
  libopenblas-dev                         # CBLAS for every matmul (kernels picked at load, see README)
  libdnnl-dev                             # oneDNN: bf16 matmuls (loaded at first use, see core/gemm.h)
  libopenmpi-dev openmpi-bin              # the MPI backend and mpirun
  libgtest-dev libgmock-dev               # tests
  libbenchmark-dev                        # bench/
  libcli11-dev                            # the tandem command's flags
  nlohmann-json3-dev                      # JSON: traces, metrics, tuner cache, checkpoint metadata
  libfmt-dev                              # formatting of messages and tables
  libssl-dev                              # libcrypto's SHA-256: checkpoint and JIT-cache checksums
  libsentencepiece-dev                    # the BPE tokenizer of tandem tokenize
  iproute2 util-linux                     # ip netns, unshare: the multihost tests' two hosts
  python3-dev pybind11-dev                # the tandem Python package (docs/python.md)
  python3-numpy python3-pytest            # its arrays and its tests (the python label)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo -E)
fi
echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -q
"${sudo[@]}" apt-get install -y -q "${missing[@]}"
