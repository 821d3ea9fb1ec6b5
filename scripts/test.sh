#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian/Ubuntu machine with Rust: makes sure a
# redis-server binary is there (the tests start their own servers on free loopback ports, so a
# system Redis on 6379 is neither needed nor in the way), then runs every test of the workspace
# with all features. Extra arguments go to `cargo test`, e.g. `scripts/test.sh -- --nocapture`.
#
# Environment: REDIS_SERVER_BIN picks the redis-server binary (default: `redis-server` on PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

have_redis() {
  command -v "${REDIS_SERVER_BIN:-redis-server}" >/dev/null 2>&1
}

if ! have_redis && [ -z "${REDIS_SERVER_BIN:-}" ]; then
  echo "==> redis-server not found; trying to install it"
  if command -v apt-get >/dev/null 2>&1; then
    as_root=()
    if [ "$(id -u)" -ne 0 ]; then
      if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
      else
        echo "==> not root and no password-less sudo: cannot install it here" >&2
      fi
    fi
    if [ "$(id -u)" -eq 0 ] || [ "${#as_root[@]}" -gt 0 ]; then
      # Installing the package may start a system Redis on 6379: harmless, the tests use their own.
      echo "==> apt-get update && apt-get install -y redis-server"
      "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q ||
        echo "==> apt-get update failed" >&2
      "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server ||
        echo "==> apt-get install redis-server failed" >&2
    fi
  else
    echo "==> no apt-get: cannot install it here" >&2
  fi
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

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found: install Rust (https://rustup.rs)." >&2
  exit 1
fi

echo "==> cargo test --workspace --all-features $*"
cargo test --workspace --all-features "$@"
