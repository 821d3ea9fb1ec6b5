#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian/Ubuntu machine with Rust: makes sure a
# redis-server binary is there (the tests start their own servers on free loopback ports, so a
# system Redis on 6379 is neither needed nor in the way) and the openssl command (the TLS tests
# make a throwaway CA with it), then runs every test of the workspace with every feature but
# `test-util` (so the suite runs the clock applications run), the tests that pause tokio's
# clock with `test-util` too, then the Redis tests again as the crate's limited ACL user.
# Extra arguments go to the first `cargo test`, e.g. `scripts/test.sh -- --nocapture`.
#
# Environment: REDIS_SERVER_BIN picks the redis-server binary (default: `redis-server` on PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

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

# Every feature but test-util: lock deadlines on the boot clock alone, as in applications.
features=tower-lock/sentinel,tower-lock/cluster,tower-lock/keyed-hash,tower-lock/metrics,tower-lock/tls,tower-lock/macros
echo "==> cargo test --workspace --features $features $*"
cargo test --workspace --features "$features" "$@"

# With test-util: the tests on tokio's paused clock (the interleavings, the testing guide's).
echo "==> cargo test --all-features --test interleavings"
cargo test --all-features --test interleavings
echo "==> cargo test --all-features --doc -- guide::testing"
cargo test --all-features --doc -- guide::testing

# Second pass, same binaries: the Redis tests again, with every client logged in as
# the crate's limited ACL user (the README's line; tests/support/acl.rs). Any ACL denial fails
# the test. Not run here: sentinel and tls (their own servers and grants), acl (makes its own
# users), harness (checks the fixture's plain URL), ui (no Redis).
acl_tests=(cluster engine fair_rw inspect key_fuzz keyed_hash layer locked metrics multi_key quarantine
  redis_faults redlock replicas semaphore waiter_caps)
echo "==> TOWER_LOCK_TEST_ACL=1 cargo test --workspace --features $features ${acl_tests[*]/#/--test }"
TOWER_LOCK_TEST_ACL=1 cargo test --workspace --features "$features" "${acl_tests[@]/#/--test=}"
