#!/usr/bin/env bash
# `npm run model`: checks model/watermark.pml with spin, exhaustively. The
# design must hold (no assertion violated in any interleaving), and spin
# must find the violation in every mutant. Needs spin (Debian: apt-get
# install spin) and a C compiler.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
command -v spin >/dev/null || { echo "model: spin is not installed (Debian: apt-get install spin)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp "$here/watermark.pml" "$work/"
cd "$work"

# check NAME [-DMUTANT]: prints the verdict line, returns 0 when the run
# found a violation, 1 when it found none.
check() {
  local name="$1"; shift
  rm -f pan pan.* ./*.trail
  spin "$@" -a watermark.pml >/dev/null
  gcc -O2 -w -DSAFETY -DCOLLAPSE -DMEMLIM=4000 -o pan pan.c
  local out
  out="$(./pan -m1000000 -E 2>&1)"
  if grep -q 'reached -DMEMLIM bound\|max search depth too small' <<<"$out"; then
    echo "model: $name: the search did not complete" >&2
    echo "$out" >&2
    exit 1
  fi
  local states errors
  states="$(grep -o '[0-9.e+]* states, stored' <<<"$out" | head -n1)"
  errors="$(grep -o 'errors: [0-9]*' <<<"$out" | head -n1)"
  printf '%-22s %-10s %s\n' "$name" "$errors" "($states)"
  [[ "$errors" != "errors: 0" ]]
}

status=0
if check design; then echo "model: the design violates the invariant" >&2; status=1; fi
for mutant in NO_HOLDER_CHECK NO_CANDIDATE_CHECK NO_ORPHAN_RULE H_BEFORE_S; do
  if ! check "$mutant" "-D$mutant"; then echo "model: spin found no violation in mutant $mutant" >&2; status=1; fi
done
[[ $status == 0 ]] && echo "model: the invariant holds in every interleaving, and each mutant breaks it"
exit $status
