#!/usr/bin/env bash
# Unpacks the cudnn-frontend headers (header-only; shipped in the PyPI wheel nvidia-cudnn-frontend)
# into .deps/cudnn_frontend (git-ignored), unless they are there. Used by install_deps.sh (when
# nvcc is found) and scripts/gpu/make_deps.sh (always: the GPU machine builds with them).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
version="1.32.0"
dest="$root/.deps/cudnn_frontend"
[ -f "$dest/include/cudnn_frontend.h" ] && exit 0
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
echo "lychee: fetching the cudnn-frontend headers (nvidia-cudnn-frontend==$version) from PyPI" >&2
python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
  --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "nvidia-cudnn-frontend==$version" -d "$tmp" >&2
rm -rf "$dest"
python3 - "$tmp" "$dest" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
dest = sys.argv[2]
with zipfile.ZipFile(whl) as z:
    members = [m for m in z.namelist() if m.startswith("include/")]
    if not any(m.endswith("cudnn_frontend.h") for m in members):
        sys.exit(f"{whl}: no include/cudnn_frontend.h inside")
    for m in members:
        z.extract(m, dest)
PY
