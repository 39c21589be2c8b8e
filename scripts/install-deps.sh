#!/usr/bin/env bash
# Installs the Debian packages stepcast builds and tests with (DESIGN.md, Dependencies).
# Installs only what is missing; needs root or sudo. Safe to run again.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  time                      # bench/: wall time and peak memory of a command
  libsimgrid-dev            # the simulator (issue 3)
  nlohmann-json3-dev
  libssl-dev                # SHA-256 of programs and checkpoints (OpenSSL's libcrypto)
  zlib1g-dev                # gzip outputs (simulate --gzip) and reading them back (compare)
  libboost-program-options-dev
  catch2
  libopenmpi-dev openmpi-bin
  libopenblas-dev
  chromium                  # the validate report's test in a real headless browser
  clang libclang-rt-dev     # libFuzzer for the loaders' fuzz targets (issue 19, scripts/fuzz.sh)
  iproute2 iputils-ping     # scripts/netns-cluster.sh: namespaces, veth, tc; ping for latency (issue 21)
  python3-jsonschema        # tests: every input and output against its JSON Schema (schemas/, issue 18)
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
