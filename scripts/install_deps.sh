#!/usr/bin/env bash
# Installs lychee's build dependencies from Debian/Ubuntu packages (skips what is present), stages
# cpp-httplib's header from Debian 13's source package (scripts/fetch_httplib.sh says why), and,
# when nvcc is found, the cudnn-frontend headers the CUDA backend compiles against.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pkgs=(cmake ninja-build g++ clang pkg-config python3 python3-pip python3-dev python3-venv
      nlohmann-json3-dev libcli11-dev libfmt-dev libopenblas-dev libpcre2-dev libutf8proc-dev
      libgtest-dev dpkg-dev xz-utils debian-archive-keyring)
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

# cpp-httplib: header-only, Debian 13's release (Debian 12's 0.11 lacks the server's limits).
"$root/scripts/fetch_httplib.sh"
# cudnn-frontend is header-only; its headers ship in a PyPI wheel (scripts/fetch_cudnn_frontend.sh).
if command -v nvcc >/dev/null 2>&1; then "$root/scripts/fetch_cudnn_frontend.sh"; fi
