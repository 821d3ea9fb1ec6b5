#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian/Ubuntu machine with Rust: makes sure a
# redis-server binary is there (the tests start their own servers on free loopback ports, so a
# system Redis on 6379 is neither needed nor in the way) and the openssl command (the TLS tests
# make a throwaway CA with it), then runs every test of the workspace with every feature but
# `test-util` (so the suite runs the clock applications run), the tests that pause tokio's
# clock with `test-util` too, then the Redis tests again as the crate's limited ACL user.
# Each pass's test binaries are built first, then run side by side (TEST_JOBS at a time, 3 by
# default), with the doc tests; each binary's output is shown whole once it is done. Extra
# arguments go to each test binary of the first pass (libtest's options and name filters), e.g.
# `scripts/test.sh --nocapture`.
#
# Every test binary of every pass runs, even after a failure.
# The script ends with a summary: the binaries run, the tests passed, failed and ignored, each
# failing binary and test, and the time taken. Its last line is always
# `summary: N passed, M failed`, where M also counts a binary that ended without a result (a
# crash) and a pass whose build failed (the binaries it did not build did not run); the exit
# status is non-zero whenever M is.
#
# Environment: REDIS_SERVER_BIN picks the redis-server binary (default: `redis-server` on PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A run that stops before its summary (a missing tool, an interrupt) still ends with the line.
summarized=false
trap '[ "$summarized" = true ] || echo "summary: 0 passed, 1 failed"' EXIT

have_redis() {
  command -v "${REDIS_SERVER_BIN:-redis-server}" >/dev/null 2>&1
}

# Installs the Debian package $1 with apt-get, as root or through password-less sudo; reports
# (but does not fail on) what it cannot do, so the checks below give the real error.
apt_install() {
  echo "==> $1 not found; trying to install it"
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "==> no apt-get: cannot install it here" >&2
    return
  fi
  local as_root=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      as_root=(sudo -n)
    else
      echo "==> not root and no password-less sudo: cannot install it here" >&2
      return
    fi
  fi
  echo "==> apt-get update && apt-get install -y $1"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
    echo "==> apt-get update failed" >&2
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$1" ||
    echo "==> apt-get install $1 failed" >&2
}

if ! have_redis && [ -z "${REDIS_SERVER_BIN:-}" ]; then
  # Installing the package may start a system Redis on 6379: harmless, the tests use their own.
  apt_install redis-server
fi

if ! have_redis; then
  if [ -n "${REDIS_SERVER_BIN:-}" ]; then
    echo "error: REDIS_SERVER_BIN=$REDIS_SERVER_BIN is not an executable." >&2
  fi
  echo "error: the tests need redis-server. Install it:" >&2
  echo "  Debian/Ubuntu: sudo apt-get install redis-server" >&2
  echo "  macOS:         brew install redis" >&2
  echo "or point REDIS_SERVER_BIN at a redis-server binary." >&2
  exit 1
fi
echo "==> using $(command -v "${REDIS_SERVER_BIN:-redis-server}"): $("${REDIS_SERVER_BIN:-redis-server}" --version)"

# The TLS tests make a throwaway CA and server certificate with the openssl command.
if ! command -v openssl >/dev/null 2>&1; then
  apt_install openssl
fi
if ! command -v openssl >/dev/null 2>&1; then
  echo "error: the TLS tests need the openssl command (Debian/Ubuntu: apt-get install openssl)." >&2
  exit 1
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found: install Rust (https://rustup.rs)." >&2
  exit 1
fi

started=$SECONDS
summarized=false
logs=$(mktemp -d)
trap 'rm -rf "$logs"; [ "$summarized" = true ] || echo "summary: 0 passed, 1 failed"' EXIT
passes=()

# Test binaries run side by side (most of the suite waits on leases, timeouts and stalled
# servers rather than on the CPU), longest first; TEST_JOBS sets how many at once.
parallel=${TEST_JOBS:-3}
# The binaries that take longest, started first so that none is left running alone at the end.
slow_first=(chaos ui "unittests src/lib" faults deployments interleavings)

# Builds a pass's test binaries: `cargo test --no-run` with the arguments after $1 (the
# pass's name). Its messages go to "$logs/<n>.log", its exit status to "$logs/<n>.status", and
# the binaries, one `<package dir>|<label>|<executable>` per line, to "$logs/<n>.bins"; the
# label is what cargo's `Running` line names (`tests/x.rs`, `tests/x/main.rs`, or
# `unittests src/lib.rs`).
build() {
  local name=$1 n=${#passes[@]}
  shift
  passes+=("$name")
  echo "==> [$name] cargo test --no-run $*"
  local status=0
  cargo test --no-run --message-format=json-render-diagnostics "$@" >"$logs/$n.json" 2> >(tee "$logs/$n.log" >&2) || status=$?
  wait
  echo "$status" >"$logs/$n.status"
  # Test harness artifacts only (examples are built too, but not run).
  # A build that made no test binary (it failed first) leaves the list empty, not the script.
  { grep '"executable":"' "$logs/$n.json" || true; } | { grep '"test":true},"features"' || true; } |
    sed -n 's/.*"manifest_path":"\([^"]*\)\/Cargo.toml","target":{"kind":\["\([a-z-]*\)".*"src_path":"\([^"]*\)".*"executable":"\([^"]*\)".*/\1 \2 \3 \4/p' |
    while read -r dir kind src exe; do
      src=${src#"$PWD/"}
      [ "$kind" = test ] || src="unittests $src"
      echo "$dir|$src|$exe"
    done >"$logs/$n.bins"
}

# Queues a job for each binary of pass $1 (see build), run in the ACL mode when $2 is 1; with
# more arguments, only for the binaries they name (`x` names `tests/x.rs` and `tests/x/main.rs`).
# A job is "<pass n> <0 or 1> <a line of the .bins file>"; a doc-test job is
# "<pass n> doc <cargo test arguments>".
queue_bins() {
  local n=$1 acl=$2
  shift 2
  local dir label exe
  while IFS='|' read -r dir label exe; do
    if [ $# -gt 0 ]; then
      local wanted=false name=${label%/main.rs}
      name=${name##*/}
      name=${name%.rs}
      for keep in "$@"; do [ "$keep" = "$name" ] && wanted=true; done
      [ "$wanted" = true ] || continue
    fi
    echo "$n $acl $dir|$label|$exe"
  done <"$logs/$n.bins" >>"$logs/jobs"
  # A name that matches no binary (a test renamed, say) fails the pass, as cargo's `--test` does.
  local keep
  for keep in "$@"; do
    if ! grep -qE "/$keep(\.rs|/main\.rs)\|" "$logs/$n.bins"; then
      echo "error: no test binary named $keep" | tee -a "$logs/$n.log" >&2
      echo 1 >"$logs/$n.status"
    fi
  done
}

# Runs one job (line $2, numbered $1) as cargo would: in its package's directory, with
# CARGO_MANIFEST_DIR set and the toolchain's libraries on the library path; prints its output
# once it is done.
run_job() {
  local i=$1 n acl rest dir label exe
  read -r n acl rest <<<"$2"
  local out="$logs/job-$i.out"
  if [ "$acl" = doc ]; then
    # shellcheck disable=SC2086 # a doc job's cargo arguments, as queued
    cargo test --no-fail-fast $rest >"$out" 2>&1 || true
  else
    IFS='|' read -r dir label exe <<<"$rest"
    echo "     Running $label ($exe)" >"$out"
    local extra=()
    [ "$n" = 0 ] && extra=("${test_args[@]}")
    (
      cd "$dir"
      export CARGO_MANIFEST_DIR="$dir"
      # A proc-macro crate's test binary links the standard library dynamically.
      export LD_LIBRARY_PATH="$rust_libs:${exe%/*}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      [ "$acl" = 1 ] && export TOWER_LOCK_TEST_ACL=1
      "$exe" "${extra[@]}"
    ) >>"$out" 2>&1 || true
  fi
  flock "$logs/print.lock" sh -c "echo '==> [${passes[$n]}] job $i done'; cat '$out'"
}

: >"$logs/jobs"
test_args=("$@")
sysroot=$(rustc --print sysroot)
rust_libs="$sysroot/lib/rustlib/$(rustc -vV | sed -n 's/^host: //p')/lib:$sysroot/lib"

# Every feature but test-util: lock deadlines on the boot clock alone, as in applications.
features=tower-lock/sentinel,tower-lock/cluster,tower-lock/keyed-hash,tower-lock/metrics,tower-lock/tls,tower-lock/macros,tower-lock/serde,tower-lock/tonic,tower-lock/unstable-backend,tower-lock/idempotency,tower-lock/retry
build main --workspace --features "$features"
queue_bins 0 0
echo "0 doc --workspace --features $features --doc" >>"$logs/jobs"

# With test-util: the tests on tokio's paused clock (the interleavings, the testing guide's).
build test-util --all-features --test interleavings
queue_bins 1 0
echo "1 doc --all-features --doc -- guide::testing" >>"$logs/jobs"

# The Redis tests again, same binaries, with every client logged in as the crate's limited
# ACL user (the README's line; tests/support/acl.rs). Any ACL denial fails the test. A binary
# runs here only if every test in it can: locks, deployments, http and idempotency. Not run here: setup
# (sentinel and tls make their own servers and grants, acl its own users, harness checks the
# fixture's plain URL), faults (late_commands talks through a proxy to the plain address, the
# wrapped stores and server faults run as the default user), services, ui (no Redis).
passes+=(acl)
cp "$logs/0.bins" "$logs/2.bins"
# The pass fails on the build only when one of its binaries was not built (queue_bins says so).
echo 0 >"$logs/2.status"
: >"$logs/2.log"
queue_bins 2 1 locks deployments http idempotency

# The doc tests (compiled as they run) and the slow binaries first, then the rest in the order
# queued.
{
  grep -E '^[0-9]+ doc ' "$logs/jobs" || true
  for slow in "${slow_first[@]}"; do
    grep -E "[ /|]$slow(\.rs|/main\.rs)?\|" "$logs/jobs" || true
  done
  cat "$logs/jobs"
} | awk '!seen[$0]++' >"$logs/ordered"
total=$(wc -l <"$logs/ordered")
echo "==> running $total test binaries and doc-test runs, $parallel at a time"
i=0
while read -r job; do
  i=$((i + 1))
  while [ "$(jobs -rp | wc -l)" -ge "$parallel" ]; do
    wait -n || true
  done
  run_job "$i" "$job" &
  echo "$job" >"$logs/job-$i.line"
done <"$logs/ordered"
wait

# Each pass's output in the order its jobs were queued, after its build's.
for j in $(seq 1 "$i"); do
  read -r n _ <"$logs/job-$j.line"
  cat "$logs/job-$j.out" >>"$logs/$n.log"
done

# The summary, from each pass's output: a binary starts at cargo's `Running` or `Doc-tests`
# line and ends at libtest's `test result:` line, after which the last `failures:` list names
# its failed tests. A binary with no result line crashed.
summary=$(
  for n in "${!passes[@]}"; do
    awk -v pass="${passes[$n]}" -v status="$(cat "$logs/$n.status")" '
      function finish() {
        if (bin != "" && !done) { crashed++; binaries++; print "F " pass ": " bin " ended without a test result" }
        bin = ""; done = 0; listing = 0
      }
      # `Running tests/x.rs (path)`, or `Running unittests src/lib.rs (path/crate-hash)`.
      /^ *Running / {
        finish(); bin = $2
        if ($2 == "unittests") { stem = $NF; sub(/.*\//, "", stem); sub(/-[0-9a-f]+\)$/, "", stem); bin = "unittests " $3 " (" stem ")" }
        next
      }
      /^ *Doc-tests / { finish(); bin = "doc-tests " $2; next }
      bin != "" && /^failures:$/ { listing = 1; delete names; count = 0; next }
      listing && /^    [^ ]/ { names[++count] = substr($0, 5); next }
      listing && /^$/ { next }
      bin != "" && /^test result: / {
        line = $0
        sub(/^test result: [A-Za-z]+\. /, "", line)
        split(line, parts, /; /)
        p = parts[1] + 0; f = parts[2] + 0; i = parts[3] + 0
        passed += p; failed += f; ignored += i; binaries++
        if (f > 0) {
          print "F " pass ": " bin ", " f " failed:"
          for (k = 1; k <= count; k++) print "T " pass ": " names[k]
        }
        done = 1; listing = 0; delete names; count = 0
        next
      }
      { listing = 0 }
      END {
        finish()
        # The build (or cargo itself) failed: the binaries it did not make did not run, whatever
        # the others did.
        if (status != 0) {
          crashed++; print "F " pass ": cargo test --no-run failed (exit status " status "): binaries it did not build did not run; see its output"
        }
        print "C " binaries + 0, passed + 0, failed + 0, ignored + 0, crashed + 0
      }' "$logs/$n.log"
  done
)
read -r binaries passed failed ignored broken < <(
  awk '/^C / { b += $2; p += $3; f += $4; i += $5; c += $6 } END { print b + 0, p + 0, f + 0, i + 0, c + 0 }' <<<"$summary"
)
elapsed=$((SECONDS - started))
echo
echo "==> summary of ${#passes[@]} passes (${passes[*]}) in $((elapsed / 60)) min $((elapsed % 60)) s"
echo "    binaries run: $binaries; tests: $passed passed, $failed failed, $ignored ignored"
if grep -q '^F ' <<<"$summary"; then
  echo "    failed:"
  sed -n -e 's/^F /      /p' -e 's/^T [^:]*: /        /p' <<<"$summary"
fi
summarized=true
echo "summary: $passed passed, $((failed + broken)) failed"
[ "$((failed + broken))" -eq 0 ]
