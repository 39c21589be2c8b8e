#!/usr/bin/env bash
# `cmake --install` into a fresh prefix, then the installed stepcast run from another folder with
# shipped inputs by name: the binary, the models, topologies, profiles, examples, sweeps and the
# corpus are where it looks for them.
#   tests/install.sh BUILD_DIR
set -euo pipefail
build=$1
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
for d in bin/stepcast share/stepcast/models/llama3-8b.json share/stepcast/topologies/dgx-h100.json \
         share/stepcast/profiles/h100-sxm.json share/stepcast/examples/tiny-cpu.json share/stepcast/sweeps/cpu.json \
         share/stepcast/data/published.json share/stepcast/data/corpus/shakespeare.txt \
         share/stepcast/schemas/step-result.schema.json share/stepcast/schemas/plan.schema.json \
         share/stepcast/scripts/mpirun share/man/man1/stepcast.1 share/bash-completion/completions/stepcast; do
  [ -e "$prefix/$d" ] || { echo "install: $d missing under $prefix"; exit 1; }
done
cd /
out=$("$prefix/bin/stepcast" simulate --model tiny --topology dgx-h100 --nodes 1 --plan tiny-cpu --no-scaling 2>&1)
echo "$out" | grep -q "stepcast simulate: tiny (sequence 64) on dgx-h100" || { echo "$out"; exit 1; }
echo "$out" | grep -q "profile .*h100-sxm.json" || { echo "install: the topology's profile was not found: $out"; exit 1; }
set +e
bad=$("$prefix/bin/stepcast" simulate --model no-such-model --topology dgx-h100 --plan tiny-cpu 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] && echo "$bad" | grep -q "shipped name: .*llama3-8b" || { echo "install: rc $rc: $bad"; exit 1; }
# validate from / with the installed launcher and the shipped sweep by name (one short run a point).
out=$("$prefix/bin/stepcast" validate --sweep ci --repeats 1 --out "$prefix/validate" 2>&1) ||
  { echo "install: validate failed: $out"; exit 1; }
[ -f "$prefix/validate/validate.json" ] || { echo "install: no validate.json: $out"; exit 1; }
echo "install: ok ($prefix)"
