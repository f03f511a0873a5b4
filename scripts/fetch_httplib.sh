#!/usr/bin/env bash
# Stages cpp-httplib's header-only httplib.h for the server (src/server/http*.cpp) into
# .deps/httplib/ (git-ignored): include/httplib.h, copyright, VERSION. CMake looks there first
# (cmake/Dependencies.cmake); the GPU machine gets the same folder inside the carried .deps.
#
# Why not Debian 12's libcpp-httplib-dev: 0.11.4 reads chunked request bodies without a limit,
# has no header-count limit, gives handlers no way to see a closed client and hides its request
# reader behind a compiled library. Debian 13 (trixie) ships 0.18.7 with the security fixes
# backported (CVE-2025-46728, -52887, -53629). That source package is taken from Debian's archive
# through private apt lists (the system's apt state is untouched): apt checks the signed Release
# file against debian-archive-keyring and each source file against the signed Sources index;
# dpkg-source -x applies Debian's patches. Whatever trixie's current version is comes (old
# versions leave the archive); the build refuses one older than 0.18.7.
# Idempotent: an existing .deps/httplib/include/httplib.h is kept (delete the folder to refetch).
#   scripts/fetch_httplib.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.deps/httplib"
suite=trixie
log() { echo "fetch_httplib: $*" >&2; }

if [ -f "$dest/include/httplib.h" ]; then exit 0; fi
for tool in apt-get dpkg-source xz; do
  command -v "$tool" >/dev/null || { log "$tool is missing (apt-get install dpkg-dev xz-utils)"; exit 1; }
done
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || { log "$keyring is missing (apt-get install debian-archive-keyring)"; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/parts" "$tmp/src"
for uri_suites in "http://deb.debian.org/debian|$suite $suite-updates" \
                  "http://deb.debian.org/debian-security|$suite-security"; do
  printf 'Types: deb-src\nURIs: %s\nSuites: %s\nComponents: main\nSigned-By: %s\n\n' \
    "${uri_suites%%|*}" "${uri_suites#*|}" "$keyring" >> "$tmp/parts/debian.sources"
done
apt_opts=(-o "APT::Sandbox::User=root" -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache"
          -o "Debug::NoLocking=1" -o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$tmp/parts")
log "apt-get update (Debian $suite sources, private lists under $tmp)"
apt-get "${apt_opts[@]}" update -q >"$tmp/update.log" 2>&1 || { cat "$tmp/update.log" >&2; exit 1; }
# The newest version over trixie, -updates and -security (apt-get source picks it).
(cd "$tmp/src" && apt-get "${apt_opts[@]}" source --download-only cpp-httplib >"$tmp/source.log" 2>&1) ||
  { cat "$tmp/source.log" >&2; exit 1; }
(cd "$tmp/src" && dpkg-source -x ./*.dsc tree 2>&1 | grep -v -e '^gpgv:' -e 'cannot verify inline signature' >&2) || true
# (apt checked every source file against the signed Sources index; dpkg-source's own check of the
# .dsc signature would need the debian-keyring package, hence its warning is dropped.)
[ -f "$tmp/src/tree/httplib.h" ] || { log "the source package holds no httplib.h"; exit 1; }
version="$(sed -n 's/^Version: //p' "$tmp"/src/*.dsc | head -1)"
mkdir -p "$dest/include"
cp "$tmp/src/tree/httplib.h" "$dest/include/"
cp "$tmp/src/tree/debian/copyright" "$dest/copyright"   # the licence travels with the copy
echo "cpp-httplib (Debian $suite source) $version httplib.h sha256=$(sha256sum "$dest/include/httplib.h" | cut -d' ' -f1)" \
  > "$dest/VERSION"
log "staged $(cat "$dest/VERSION")"
