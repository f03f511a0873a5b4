#!/usr/bin/env bash
# Installs lychee's build dependencies from Debian/Ubuntu packages (skips what is present), and,
# when nvcc is found, the cudnn-frontend headers the CUDA backend compiles against.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkgs=(cmake ninja-build g++ clang pkg-config python3 python3-pip
      nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev libpcre2-dev libutf8proc-dev
      libgtest-dev libcpp-httplib-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "lychee: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q >&2
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

# cudnn-frontend is header-only; its headers ship in the PyPI wheel nvidia-cudnn-frontend and are
# unpacked into .deps/cudnn_frontend (git-ignored).
if command -v nvcc >/dev/null 2>&1 && [ ! -f "$root/.deps/cudnn_frontend/include/cudnn_frontend.h" ]; then
  tmp="$(mktemp -d)"
  echo "lychee: fetching the cudnn-frontend headers from PyPI" >&2
  python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: \
    "nvidia-cudnn-frontend==1.32.0" -d "$tmp" >&2
  python3 - "$tmp" "$root/.deps/cudnn_frontend" <<'PY'
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
  rm -rf "$tmp"
fi
