#!/usr/bin/env bash
# Runs the whole test suite on a fresh Debian/Ubuntu machine with Rust: makes sure a
# redis-server binary is there (the tests start their own servers on free ports), then runs
# every test of the workspace with all features. Extra arguments go to `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."

redis_bin="${REDIS_SERVER_BIN:-redis-server}"
if ! command -v "$redis_bin" >/dev/null 2>&1; then
  echo "==> redis-server not found; installing it"
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
      if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        sudo="sudo -n"
      fi
    fi
    if [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; then
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
      $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server
    fi
  fi
fi
if ! command -v "$redis_bin" >/dev/null 2>&1; then
  echo "error: the tests need redis-server. Install it (Debian/Ubuntu: apt-get install redis-server," >&2
  echo "macOS: brew install redis) or point REDIS_SERVER_BIN at the binary." >&2
  exit 1
fi
echo "==> using $("$redis_bin" --version)"

echo "==> cargo test --workspace --all-features"
cargo test --workspace --all-features "$@"
