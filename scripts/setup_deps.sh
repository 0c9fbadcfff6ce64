#!/usr/bin/env bash
# Installs the pinned third-party pieces the build needs under .deps/ (ignored by git), so that a
# fresh machine, or a machine without network that receives .deps/ as a copy, can build.
#   CUTLASS/CuTe headers  nvidia-cutlass 4.2.0.0 (PyPI wheel, headers under cutlass_library/source/include)
#   GoogleTest            1.12.1 (Debian package googletest, sources under /usr/src/googletest)
#   Python environment    .deps/venv: apache-tvm-ffi 0.1.15.post2 (the Python package's binding),
#                         scikit-build-core, numpy, ml_dtypes, pytest (PyPI, versions pinned below)
# Safe to re-run: finished steps are skipped.
set -euo pipefail

CUTLASS_VERSION=4.2.0.0
GTEST_DEB_VERSION=1.12.1-0.2

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps="$root/.deps"
mkdir -p "$deps"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

# CUTLASS / CuTe headers.
if [ ! -f "$deps/cutlass/include/cute/tensor.hpp" ]; then
  echo "setup_deps: fetching nvidia-cutlass==$CUTLASS_VERSION headers"
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    "nvidia-cutlass==$CUTLASS_VERSION" -d "$tmp"
  rm -rf "$deps/cutlass"
  python3 - "$tmp" "$deps/cutlass" <<'PY'
import glob, os, sys, zipfile
src, dst = sys.argv[1], sys.argv[2]
prefix = "cutlass_library/source/include/"
(wheel,) = glob.glob(os.path.join(src, "nvidia_cutlass-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            out = os.path.join(dst, "include", name[len(prefix):])
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(name) as f, open(out, "wb") as g:
                g.write(f.read())
PY
  echo "$CUTLASS_VERSION" > "$deps/cutlass/VERSION"
  rm -rf "$tmp"
fi

# GoogleTest sources.
if [ ! -f "$deps/googletest/CMakeLists.txt" ]; then
  if [ ! -f /usr/src/googletest/CMakeLists.txt ]; then
    echo "setup_deps: installing googletest=$GTEST_DEB_VERSION"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      "googletest=$GTEST_DEB_VERSION" >/dev/null
  fi
  rm -rf "$deps/googletest"
  cp -r /usr/src/googletest "$deps/googletest"
fi

# Python environment for the Python package (build and tests). apache-tvm-ffi must stay < 0.2: the
# module is built against its 0.1 C ABI. Transitive dependencies are pinned too.
PYTHON_REQUIREMENTS=(
  apache-tvm-ffi==0.1.15.post2 typing_extensions==4.16.0
  scikit-build-core==0.11.6 packaging==26.3 pathspec==1.1.1
  numpy==2.4.6 ml_dtypes==0.5.4
  pytest==9.2.0 iniconfig==2.3.1 pluggy==1.7.0 Pygments==2.21.0
)
# MLA_PYTHON=/path/to/python uses an existing interpreter instead (a machine without PyPI that
# brings its own packages): it must import tvm_ffi, numpy, ml_dtypes and pytest.
venv="$deps/venv"
if [ -n "${MLA_PYTHON:-}" ]; then
  "$MLA_PYTHON" -c "import tvm_ffi, numpy, ml_dtypes, pytest" || {
    echo "setup_deps: MLA_PYTHON=$MLA_PYTHON cannot import tvm_ffi, numpy, ml_dtypes and pytest" >&2
    exit 1
  }
  venv="$MLA_PYTHON (MLA_PYTHON)"
elif [ "$(cat "$venv/REQUIREMENTS" 2>/dev/null)" != "${PYTHON_REQUIREMENTS[*]}" ]; then
  echo "setup_deps: creating the Python environment $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${PYTHON_REQUIREMENTS[@]}"
  echo "${PYTHON_REQUIREMENTS[*]}" > "$venv/REQUIREMENTS"
fi

echo "setup_deps: CUTLASS $(cat "$deps/cutlass/VERSION"), GoogleTest sources in $deps/googletest," \
  "Python environment in $venv"
