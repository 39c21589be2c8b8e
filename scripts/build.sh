#!/usr/bin/env bash
# Configures and builds stepcast in build/ (Release, -Wall -Wextra -Wshadow -Werror). Used by main.sh,
# test.sh and the bench scripts; BUILD_DIR overrides the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release >"$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
cmake --build "$build_dir" -j"$(nproc)"
