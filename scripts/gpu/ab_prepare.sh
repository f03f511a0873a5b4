#!/usr/bin/env bash
# Prepares an A/B variant for `scripts/gpu/run_all.sh bench-ab`: .ab/NAME/ holds the files that
# differ in the variant (their text at REV), so that the GPU machine builds the working tree as it
# is and the variant beside it in one call. Run here, carry ".ab" (ignored by git).
#   scripts/gpu/ab_prepare.sh NAME REV [PATH...]   PATHs default to the src/ and bench/ files
#                                                  changed between REV and the working tree
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
[ $# -ge 2 ] || { echo "usage: $0 NAME REV [PATH...]" >&2; exit 2; }
name=$1 rev=$2; shift 2
git rev-parse --verify -q "$rev^{commit}" > /dev/null || { echo "$0: no commit $rev" >&2; exit 1; }
if [ $# -gt 0 ]; then paths=("$@"); else mapfile -t paths < <(git diff --name-only "$rev" -- src bench); fi
[ ${#paths[@]} -gt 0 ] || { echo "$0: no src/ or bench/ file differs from $rev" >&2; exit 1; }
rm -rf ".ab/$name" && mkdir -p ".ab/$name"
for p in "${paths[@]}"; do
  git cat-file -e "$rev:$p" 2>/dev/null || { echo "$0: $p does not exist at $rev (variants replace files, they do not remove them)" >&2; exit 1; }
  mkdir -p ".ab/$name/$(dirname "$p")"
  git show "$rev:$p" > ".ab/$name/$p"
done
git rev-parse --short "$rev" > ".ab/$name.rev"
echo "variant $name = the working tree with ${#paths[@]} file(s) at $(cat ".ab/$name.rev"): ${paths[*]}"
