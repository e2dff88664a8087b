#!/usr/bin/env bash
# Applies each mutant of tests/mutants/ (or those named) to a scratch copy of the repo,
# builds it, runs the etcd fault soak (up to $SEEDS seeds, $SOAK each, stopping at the
# first violation) and the scenario test named in the patch's "# scenario:" line, and
# prints: mutant | killed by soak (seed, seconds to first violation) | killed by test.
# One scratch dir and one CARGO_TARGET_DIR serve every mutant: only fencelock rebuilds.
#
#   tests/mutants/run.sh                      # every mutant
#   SEEDS="1 2" SOAK=20s tests/mutants/run.sh tests/mutants/e-*.patch
#   SCENARIOS=0 tests/mutants/run.sh          # the soak only (SOAKS=0: the tests only)
#   BASELINE=1 tests/mutants/run.sh           # the unmutated tree first: it must survive
set -uo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
scratch=${MUTANT_SCRATCH:-$repo/target/mutants/tree}
export CARGO_TARGET_DIR=${MUTANT_TARGET:-$repo/target/mutants/target}
# Incremental release builds: between two mutants only what a patch touches (and what
# depends on it) is compiled again, minutes saved per mutant on two cores. (Incremental
# code generation differs a little from CI's release build; the soak's bounds are wide.)
export CARGO_INCREMENTAL=1
test_target=${MUTANT_TEST_TARGET:-$repo/target/mutants/target-test}
seeds=${SEEDS:-"1 2 3"}
soak=${SOAK:-30s}
scenarios=${SCENARIOS:-1}
logs=$repo/target/mutants/logs
mkdir -p "$scratch" "$logs"

if [ $# -gt 0 ]; then patches=("$@"); else patches=("$repo"/tests/mutants/*.patch); fi
# BASELINE=1: soak the unmutated tree first, with the same seeds. A violation there is the
# checker's (or the library's) fault, not a kill: the table is worth nothing until the
# unmutated row survives.
if [ "${BASELINE:-0}" = 1 ]; then patches=(unmutated "${patches[@]}"); fi

rows=()
for patch in "${patches[@]}"; do
  if [ "$patch" = unmutated ]; then
    name=unmutated
    scenario=
  else
    # Absolute: the patch is read from inside the scratch dir.
    patch=$(realpath "$patch")
    name=$(basename "$patch" .patch)
    scenario=$(sed -n 's/^# scenario: *//p' "$patch" | head -1)
  fi
  # A fresh copy of the tree (the dependencies' builds are shared: only fencelock
  # rebuilds).
  rsync -a --delete --exclude /target --exclude /.git "$repo"/ "$scratch"/
  # rsync keeps the sources' times, which may be older than the last build's: make
  # sure cargo sees the crate changed.
  find "$scratch/src" "$scratch/tests" -name '*.rs' -exec touch {} +
  # Not `git apply`: the scratch dir lies inside the repository (under target/), where
  # git apply skips, silently, every path outside the current directory, so nothing would
  # be patched. And the patch must have changed the tree.
  # As strict as .ci/run's check (patch alone would apply a stale patch with an offset).
  if [ "$name" = unmutated ]; then
    :
  elif ! (cd "$repo" && git apply --check "$patch") ||
    ! (cd "$scratch" && patch -p1 --forward --quiet --no-backup-if-mismatch <"$patch"); then
    rows+=("$name | patch does not apply | -")
    continue
  elif diff -rq "$repo/src" "$scratch/src" >/dev/null; then
    rows+=("$name | patch changed nothing | -")
    continue
  fi
  echo "== $name: building" >&2
  if ! (cd "$scratch" && cargo build --release --features cli --bin fencelock) \
      >"$logs/$name.build" 2>&1; then
    rows+=("$name | does not build (see $logs/$name.build) | -")
    continue
  fi
  # Every mutant is a different program: a binary identical to the last one built means
  # the incremental build missed the patch, so build it again from scratch.
  sum=$(sha256sum "$CARGO_TARGET_DIR/release/fencelock" | cut -d' ' -f1)
  if [ "$sum" = "${last_sum:-}" ]; then
    echo "== $name: binary unchanged; building again without incremental state" >&2
    (cd "$scratch" && CARGO_INCREMENTAL=0 cargo build --release --features cli --bin fencelock) \
      >>"$logs/$name.build" 2>&1
    sum=$(sha256sum "$CARGO_TARGET_DIR/release/fencelock" | cut -d' ' -f1)
  fi
  last_sum=$sum
  soaked="survived ($(echo $seeds | wc -w) x $soak)"
  [ "${SOAKS:-1}" = 1 ] || { soaked="-"; seeds=""; }
  for seed in $seeds; do
    echo "== $name: soak seed $seed" >&2
    json=$logs/$name.$seed.json
    rm -f "$json"
    (cd "$scratch" && timeout 300 "$CARGO_TARGET_DIR/release/fencelock" chaos --soak "$soak" \
      --seed "$seed" --json "$json") >"$logs/$name.$seed.soak" 2>&1
    found=$(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
v = r.get("violations") or []
if v:
    first = r.get("first_violation_seconds")
    at = "%.1f s" % first if first is not None else "?"
    kind = v[0].split(":")[0]
    print("seed %s, %s (%d: first %s)" % (r["seed"], at, len(v), kind))
' "$json" 2>/dev/null)
    if [ ! -s "$json" ]; then found="seed $seed: soak crashed (see $logs/$name.$seed.soak)"; fi
    if [ -n "$found" ]; then soaked="killed: $found"; break; fi
  done
  tested="-"
  if [ "$scenarios" = 1 ] && [ -n "$scenario" ]; then
    echo "== $name: scenario $scenario" >&2
    # The test suite's own profile (what `cargo test` runs), in a target dir of its own.
    if (cd "$scratch" && CARGO_TARGET_DIR="$test_target" timeout 900 cargo test --test etcd "$scenario") \
        >"$logs/$name.test" 2>&1; then
      tested="survived $scenario"
    elif grep -q "could not compile" "$logs/$name.test"; then
      tested="does not build (see $logs/$name.test)"
    elif ! grep -q "test result: FAILED" "$logs/$name.test"; then
      tested="no test result (timed out? see $logs/$name.test)"
    else
      tested="killed by $scenario"
    fi
  fi
  rows+=("$name | $soaked | $tested")
  echo "   $name | $soaked | $tested" >&2
done

echo
echo "mutant | killed by soak (seed, seconds to first violation) | killed by test"
echo "--- | --- | ---"
printf '%s\n' "${rows[@]}"
