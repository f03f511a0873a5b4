#!/usr/bin/env bash
# Re-vendors llama.cpp's Jinja engine (common/jinja, with the common/json and common/unicode files
# it links against) into third_party/llama.cpp-jinja/, from the llama_cpp_python source package on
# PyPI (which ships llama.cpp under vendor/llama.cpp), then applies patches/. Run it to move to a newer
# version, then rebuild and run the chat-template tests (ctest -R ChatTemplate).
set -euo pipefail
version="${1:-0.3.36}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/third_party/llama.cpp-jinja"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-binary :all: --no-deps \
  "llama_cpp_python==$version" -d "$tmp"
src="llama_cpp_python-$version/vendor/llama.cpp"
files=(LICENSE common/json.h common/json.cpp common/unicode.h common/unicode.cpp)
tar -xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp" "$src/LICENSE" "$src/common/jinja" \
  "$src/common/json.h" "$src/common/json.cpp" "$src/common/unicode.h" "$src/common/unicode.cpp"
rm -rf "$dest/common"
mkdir -p "$dest/common"
cp "$tmp/$src/LICENSE" "$dest/LICENSE"
cp -r "$tmp/$src/common/jinja" "$dest/common/jinja"
for f in "${files[@]:1}"; do cp "$tmp/$src/$f" "$dest/$f"; done
# lychee's patches (patches/*.patch, each saying why), applied in order.
for p in "$dest"/patches/*.patch; do patch -s -d "$dest" -p1 < "$p"; done
echo "llama_cpp_python $version (PyPI sdist), vendor/llama.cpp" > "$dest/VERSION"
echo "vendored llama.cpp's Jinja engine from llama_cpp_python $version into $dest"
