#!/usr/bin/env bash
# Open MPI's TCP put protocol across a shaped link (issue 21): small-gpt pp 2 on a 2-node netns
# cluster (scripts/netns-cluster.sh, one rank per node) at RATE, run with the TCP BTL's default
# flags (emulated RDMA put: a large message goes as one fragment) and with the flags the cluster's
# mpirun passes (no put: 128 KiB fragments). Prints each run's step time and the tied-embedding
# gradient all-reduce (8.4 MB, a 2-member ring: both ranks send to each other at once) per rank
# and from the later rank's start to the last end (the first stage comes about 30 ms after the
# last), beside the time its bytes take at the shaped rate. Needs root; about a minute at 200 Mbit/s.
# BUILD=DIR picks the build directory (default build/); RATE (default 200mbit); REPEATS (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
rate=${RATE:-200mbit}
repeats=${REPEATS:-2}
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces): run as root"; exit 1; }
[ -x "$build/stepcast" ] || BUILD_DIR=$build bash scripts/build.sh >/dev/null
out=$(mktemp -d)
name=scput
trap 'bash scripts/netns-cluster.sh down --name $name >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
bash scripts/netns-cluster.sh up --nodes 2 --ranks-per-node 1 --link-rate "$rate" --name $name \
  --out "$out/cluster" >/dev/null
topology=$out/cluster/topology.json
cat >"$out/plan.json" <<'JSON'
{"name": "sgpt-pp2", "pp_size": 2, "dp_size": 1, "schedule": "1f1b", "micro_batch_size": 1, "global_batch_size": 8,
 "dtype": "fp32", "dropout": 0.0}
JSON
args=(--model models/small-gpt.json --plan "$out/plan.json" --topology "$topology")
"$build/stepcast" lower "${args[@]}" --out "$out/program" >/dev/null
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); link $rate"
python3 - "$out/program/program.json" "$topology" <<'PY'
import json, sys
program, topology = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rate = topology["fabric"]["nic_bandwidth_bytes_per_s"]
tied = [op for role in program["roles"] for op in role["ops"] if op.get("name") == "tied_embedding_grads"]
print("tied-embedding all-reduce: %.2f MB each way (2-member ring), %.0f ms at the shaped rate"
      % (tied[0]["bytes"] / 1e6, tied[0]["bytes"] / rate * 1e3))
PY
default_flags=send,put,inplace,need-ack,need-csum,hetero-rdma   # ompi_info --param btl tcp --level 5
for flags in "$default_flags" "cluster's mpirun"; do
  extra=()
  [ "$flags" = "$default_flags" ] && extra=(--mca btl_tcp_flags "$default_flags")
  for _ in $(seq "$repeats"); do
    "$out/cluster/mpirun" "${extra[@]}" -np 2 "$build/stepcast" run "${args[@]}" --backend cpu --steps 4 \
      --quiet --out "$out/run" >"$out/run.log" 2>&1 || { cat "$out/run.log"; exit 1; }
    python3 - "$out/program/program.json" "$out/run/measurement.json" "$flags" <<'PY'
import json, sys
program, measured, flags = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), sys.argv[3]
tied = {(role["index"], op["id"]) for role in program["roles"] for op in role["ops"]
        if op.get("name") == "tied_embedding_grads"}
records = [r for r in measured["ops"] if (r["rank"], r["id"]) in tied]
times = ["rank %d %.0f ms" % (r["rank"], (r["end_s"] - r["start_s"]) * 1e3) for r in records]
whole = max(r["end_s"] for r in records) - max(r["start_s"] for r in records)
print("btl_tcp_flags %-45s step %.3f s; tied all-reduce %s; from the later start to the last end %.0f ms"
      % (flags, measured["step_time_s"], ", ".join(times), whole * 1e3))
PY
  done
done
