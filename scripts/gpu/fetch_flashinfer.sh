#!/usr/bin/env bash
# Fetches FlashInfer (flashinfer-python 0.7.2.post1) and the wheels it needs beyond the GPU image
# (cp312, manylinux x86_64; the image has torch, numpy, einops, cuda-bindings, ninja, ...) HERE,
# and lays them out as two carry folders for the device machine:
#   .carry/flashinfer_a/   flashinfer-python, apache-tvm-ffi, cuda-tile, nccl4py
#   .carry/flashinfer_b/   nccl-extensions, nvidia-cudnn-frontend
# Each wheel travels as NAME.whl.tar.xz (its members repacked as an xz tar by
# scripts/gpu/wheel_xz.py, 3-4x smaller than the deflate wheel: the six wheels are ~104 MB as
# wheels, which with the ~15 MiB repo tree does not fit two 64 MiB calls, and ~40 MB repacked).
# Each folder has SHA256SUMS (its own files) and MANIFEST (every file of both halves), which
# `scripts/gpu/run_all.sh fi-stage-b` checks before it rebuilds the wheels and pip-installs them.
# Idempotent: downloads and repacks only what is missing. Needs pip and PyPI here.
#   scripts/gpu/fetch_flashinfer.sh            then: fi-stage-a / fi-stage-b (see run_all.sh)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dl=.carry/flashinfer_dl     # the wheels as downloaded (not carried)
a=.carry/flashinfer_a
b=.carry/flashinfer_b
mkdir -p "$dl" "$a" "$b"
git check-ignore -q .carry/flashinfer_a || { echo "fetch_flashinfer: .carry is not git-ignored"; exit 1; }

# Pinned: flashinfer-python 0.7.2.post1 and the newest versions its Requires-Dist admits
# (apache-tvm-ffi<0.2,>=0.1.11; cuda-tile>=1.4.0; nccl4py>=0.4.1; nccl-extensions>=0.1.0;
# nvidia-cudnn-frontend>=1.31.0), checked below against the downloaded METADATA.
half_a=(flashinfer-python==0.7.2.post1 apache-tvm-ffi==0.1.15.post2 cuda-tile==1.7.0 nccl4py==0.6.0)
half_b=(nccl-extensions==0.1.0 nvidia-cudnn-frontend==1.32.0)

wheel_of() {  # spec -> the downloaded wheel's path (empty if none)
  local name="${1%%==*}" ver="${1##*==}"
  ls "$dl"/"${name//-/_}"-"$ver"-*.whl 2>/dev/null | head -1
}

for spec in "${half_a[@]}" "${half_b[@]}"; do
  [ -n "$(wheel_of "$spec")" ] && continue
  echo "downloading $spec"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$dl" "$spec"
  [ -n "$(wheel_of "$spec")" ] || { echo "fetch_flashinfer: no wheel for $spec in $dl"; exit 1; }
done

# The pins must satisfy flashinfer's Requires-Dist (extras aside).
python3 - "$(wheel_of flashinfer-python==0.7.2.post1)" "${half_a[@]:1}" "${half_b[@]}" <<'EOF'
import sys, zipfile
try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a bare Python: pip's own copy of the same library
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
whl, pins = sys.argv[1], dict(p.split("==") for p in sys.argv[2:])
pins = {canonicalize_name(k): v for k, v in pins.items()}
with zipfile.ZipFile(whl) as z:
    meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
bad = 0
for line in meta.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    r = Requirement(line.split(":", 1)[1].strip())
    if r.marker and "extra" in str(r.marker):
        continue
    name = canonicalize_name(r.name)
    if name in pins:
        ok = r.specifier.contains(pins[name], prereleases=True)
        print(f"  requires {r}: pinned {pins[name]} {'ok' if ok else 'NOT ADMITTED'}")
        bad += not ok
sys.exit(1 if bad else 0)
EOF

pack_half() {  # folder spec...
  local dir="$1"; shift
  for spec in "$@"; do
    local whl; whl="$(wheel_of "$spec")"
    local out="$dir/$(basename "$whl").tar.xz" stamp="$dir/.$(basename "$whl").src_sha256"
    local src; src="$(sha256sum < "$whl" | cut -d' ' -f1)"
    if [ -f "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$src" ]; then continue; fi
    echo "repacking $(basename "$whl") ($(du -m "$whl" | cut -f1) MB)"
    python3 scripts/gpu/wheel_xz.py pack "$whl" "$out"
    echo "$src" > "$stamp"
  done
  # Nothing else in the folder: files of an older layout would travel for nothing.
  for f in "$dir"/*; do
    case "$f" in *.whl.tar.xz|*/SHA256SUMS|*/MANIFEST) ;; *) rm -f "$f" ;; esac
  done
}
pack_half "$a" "${half_a[@]}"
pack_half "$b" "${half_b[@]}"
for d in "$a" "$b"; do
  ( cd "$d" && sha256sum -- *.whl.tar.xz > SHA256SUMS )
done
cat "$a/SHA256SUMS" "$b/SHA256SUMS" | awk '{print $2}' | sort > "$a/MANIFEST"
cp "$a/MANIFEST" "$b/MANIFEST"

echo "fetch_flashinfer: carry folders (each with SHA256SUMS and MANIFEST):"
for d in "$a" "$b"; do
  printf '  %-24s %6.1f MiB\n' "$d/" "$(du -cb "$d"/* | tail -1 | cut -f1 | awk '{print $1 / 1048576}')"
  sed 's/^/      /' "$d/SHA256SUMS"
done
tree_mib=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1 | awk '{printf "%.1f", $1 / 1048576}')
echo "  tracked tree: $tree_mib MiB (a call carries the tree plus its carry folders; limit 64 MiB)"
