#!/usr/bin/env bash
# Installs the built `tandem` Python package (build/release/python/tandem: the extension and its
# Python files) into an interpreter's site-packages, so that `import tandem` works without
# PYTHONPATH: into a virtual environment's when PYTHON is its python, else the system's
# (/usr/local/lib/python3.X/dist-packages for Debian's /usr/bin/python3; needs root).
# The package is self-contained (the JIT's runtime is compiled into it): the build and source
# trees may move afterwards. Install again after rebuilding.
# Usage: scripts/install-python.sh [PYTHON] [BUILD_DIR]   (defaults: /usr/bin/python3, build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-/usr/bin/python3}
build=${2:-build/release}
package=$build/python/tandem
die() { echo "install-python: $*" >&2; exit 1; }
command -v "$python" >/dev/null || die "$python: no such interpreter"
ext=$(find "$package" -maxdepth 1 -name '_tandem.*.so' 2>/dev/null | head -n 1 || true)
[[ -n $ext ]] || die "$package has no _tandem extension: build it first (make run, or cmake --build --preset release)"
# The extension is built for one Python (its file names the ABI, e.g. cpython-311-x86_64-linux-gnu).
want=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
[[ $ext == *"$want" ]] ||
  die "$ext was built for another Python than $python (which loads *$want): configure the build with -DPython3_EXECUTABLE=$python"
dest=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
mkdir -p "$dest" || die "cannot create $dest"
[[ -w $dest ]] || die "$dest is not writable: run as root, or give a virtual environment's python"
# A fresh copy beside the old one, then swapped in: an interrupted install leaves the old package.
rm -rf "$dest/tandem.installing"
cp -r "$package" "$dest/tandem.installing"
find "$dest/tandem.installing" -name '__pycache__' -prune -exec rm -rf {} +
rm -rf "$dest/tandem"
mv "$dest/tandem.installing" "$dest/tandem"
echo "install-python: tandem installed into $dest"
