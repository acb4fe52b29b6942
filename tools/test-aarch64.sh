#!/usr/bin/env bash
# Builds etch for aarch64 and runs the kernels' tests under qemu (the NEON paths):
# what CI on x86-64 cannot show. Needs Debian's gcc-aarch64-linux-gnu,
# libc6-dev-arm64-cross and qemu-user, and `rustup target add aarch64-unknown-linux-gnu`.
# Usage: tools/test-aarch64.sh [cargo test arguments, default: -p etch-kernels --lib]
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
cargo clippy --target aarch64-unknown-linux-gnu --workspace --all-targets -- -D warnings
if [ $# -eq 0 ]; then set -- -p etch-kernels --lib; fi
cargo test --target aarch64-unknown-linux-gnu "$@"
