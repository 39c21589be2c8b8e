#!/usr/bin/env bash
# A cluster on one machine (issue 21): N "nodes", each its own network namespace and its own UTS
# namespace (hostname, so OpenMPI treats them as separate hosts and talks TCP, not shared memory,
# between them), K NICs each (veth pairs, NIC k of every node on the switch of rail k: a bridge),
# every link shaped by tc's token bucket (tbf) at --link-rate in both directions; optionally the
# nodes split over two leaf switches per rail joined by one uplink shaped at --uplink-rate
# (an even number of nodes: N/2 a leaf). Every interface has MTU --mtu (default auto: 9000, jumbo
# frames as cluster fabrics run, for links of 1 Gbit/s and more, which a 2-core VM could not
# forward in 1500-byte frames; 1500 below, where a jumbo frame's bucket would be a burst).
#
#   netns-cluster.sh up --nodes N --ranks-per-node R --link-rate RATE [--nics-per-node K]
#                       [--uplink-rate RATE] [--mtu BYTES] [--name NAME] [--out DIR]
#   netns-cluster.sh down [--name NAME]          removes what `up` made, and only that
#   netns-cluster.sh status [--name NAME]        exit 0 when up and whole, 1 otherwise
#   netns-cluster.sh agent NODE COMMAND...       OpenMPI's plm_rsh_agent: runs COMMAND in NODE
#
# `up` writes into DIR (default out/netns-NAME): hostfile, topology.json (a stepcast topology of
# exactly this cluster: link rate, measured ping latency), mpirun (a wrapper: hostfile, launcher
# agent, TCP on the cluster's subnet) and cluster.env. Every object it makes is named NAME-...
# and recorded in /run/stepcast-netns/NAME/made before it is made, so `down` (and `up` after a
# crash) removes exactly those. Exit 2 on bad input or a missing requirement, with nothing left.
set -euo pipefail

prog="netns-cluster.sh"
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/.." && pwd)
state_root=/run/stepcast-netns

die() { echo "$prog: $*" >&2; exit 2; }
warn() { echo "$prog: warning: $*" >&2; }
say() { echo "$prog: $*"; }

usage() {
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
}

# --- arguments -------------------------------------------------------------------------------
action=${1:-}
[ -n "$action" ] || { usage >&2; exit 2; }
shift
case "$action" in
  -h|--help|help) usage; exit 0 ;;
  agent)
    # Called by mpirun as: agent NODE CMD... (ssh's convention: the words form one shell line).
    node=${1:?agent: no node}; shift
    name=${node%-n*}
    [ -e "/run/netns/$node" ] || { echo "$prog agent: no node $node (is the cluster up?)" >&2; exit 255; }
    # A node's ranks stay on its own cores (cpus-NODE, written by up unless the nodes outnumber them).
    pin=()
    [ -s "$state_root/$name/cpus-$node" ] && pin=(taskset -c "$(cat "$state_root/$name/cpus-$node")")
    exec nsenter --net="/run/netns/$node" --uts="$state_root/$name/uts-$node" -- "${pin[@]}" /bin/sh -c "$*"
    ;;
  up|down|status) ;;
  *) echo "$prog: unknown action '$action': valid: up, down, status, agent" >&2; exit 2 ;;
esac

nodes="" ranks_per_node="" link_rate="" nics=1 uplink_rate="" mtu=auto name=stepcast out=""
while [ $# -gt 0 ]; do
  opt=$1
  [ $# -ge 2 ] || die "$opt needs a value"
  case "$opt" in
    --nodes) nodes=$2 ;;
    --ranks-per-node) ranks_per_node=$2 ;;
    --link-rate) link_rate=$2 ;;
    --nics-per-node) nics=$2 ;;
    --uplink-rate) uplink_rate=$2 ;;
    --mtu) mtu=$2 ;;
    --name) name=$2 ;;
    --out) out=$2 ;;
    *) die "unknown option '$opt': valid: --nodes --ranks-per-node --link-rate --nics-per-node --uplink-rate --mtu --name --out" ;;
  esac
  shift 2
done
[[ "$name" =~ ^[a-z][a-z0-9]{0,7}$ ]] ||
  die "--name '$name': 1-8 lower-case letters and digits, a letter first (interface names stay within Linux's 15 characters)"
state="$state_root/$name"
# Each cluster its own subnet, 10.X.0.0/16 with X from the name (200-249): rail k 10.X.k.0/24,
# node i .i+1, this host (mpirun's side) .254 on rail 0.
subnet_prefix=10.$((200 + $(printf %s "$name" | cksum | cut -d' ' -f1) % 50))
made="$state/made"
out=${out:-$repo/out/netns-$name}

# A rate as tc writes it, in bits/s: NUMBER[k|m|g][bit] (decimal prefixes, as tc's kbit/mbit/gbit).
rate_bits_per_s() {
  local r=$1
  [[ "$r" =~ ^([0-9]+(\.[0-9]+)?)([kmg]?)bit$ ]] || return 1
  local scale=1
  case "${BASH_REMATCH[3]}" in k) scale=1e3 ;; m) scale=1e6 ;; g) scale=1e9 ;; esac
  awk -v n="${BASH_REMATCH[1]}" -v s="$scale" 'BEGIN { printf "%.0f", n * s }'
}

# --- requirements ------------------------------------------------------------------------------
require_tools() {
  [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, veth pairs, tc): run as root or with sudo"
  local missing=()
  for t in ip tc nsenter unshare awk; do command -v "$t" >/dev/null || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] ||
    die "missing ${missing[*]}: apt-get install iproute2 util-linux (scripts/install-deps.sh)"
}

# --- bookkeeping: record before making, so a crash leaves a list to undo -------------------------
record() { mkdir -p "$state"; echo "$1 $2" >>"$made"; }
is_ours() { [ -f "$made" ] && grep -qx "$1 $2" "$made"; }
link_exists() { ip link show dev "$1" >/dev/null 2>&1; }

# Refuses a name that exists and that we did not make.
claim() {
  local kind=$1 obj=$2 exists=false
  case "$kind" in
    netns) [ -e "/run/netns/$obj" ] && exists=true ;;
    link) link_exists "$obj" && exists=true ;;
    uts) [ -e "$obj" ] && exists=true ;;
  esac
  if $exists && ! is_ours "$kind" "$obj"; then
    fail_up "$kind '$obj' already exists and was not made by $prog (another cluster name: --name)"
  fi
  record "$kind" "$obj"
}

remove_made() {
  [ -f "$made" ] || return 0
  # Reverse order: links before namespaces before the files that pin them.
  tac "$made" | while read -r kind obj; do
    case "$kind" in
      link) link_exists "$obj" && ip link del dev "$obj" 2>/dev/null || true ;;
      netns) [ -e "/run/netns/$obj" ] && ip netns del "$obj" 2>/dev/null || true ;;
      uts) if [ -e "$obj" ]; then umount "$obj" 2>/dev/null || true; rm -f "$obj"; fi ;;
    esac
  done
  rm -f "$made" "$state/config" "$state"/cpus-*
  rmdir "$state" "$state_root" 2>/dev/null || true
}

# A failure during `up`: undo this run's objects, then exit 2.
fail_up() {
  echo "$prog: $*" >&2
  remove_made
  exit 2
}

# --- status --------------------------------------------------------------------------------------
# Whole: every recorded object exists.
cluster_whole() {
  [ -f "$made" ] && [ -f "$state/config" ] || return 1
  local kind obj
  while read -r kind obj; do
    case "$kind" in
      link) link_exists "$obj" || return 1 ;;
      netns) [ -e "/run/netns/$obj" ] || return 1 ;;
      uts) [ -e "$obj" ] || return 1 ;;
    esac
  done <"$made"
}

if [ "$action" = status ]; then
  if cluster_whole; then
    say "$name is up: $(cat "$state/config")"
    exit 0
  fi
  if [ -f "$made" ]; then say "$name is partly up (a crash?): '$prog down --name $name' removes it"; else say "$name is down"; fi
  exit 1
fi

if [ "$action" = down ]; then
  require_tools
  if [ -f "$made" ]; then
    remove_made
    say "$name is down"
  else
    say "$name was not up (nothing recorded in $state)"
  fi
  exit 0
fi

# --- up: checks ----------------------------------------------------------------------------------
[[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 64 ] ||
  die "--nodes '${nodes}': a whole number from 1 to 64"
[[ "$ranks_per_node" =~ ^[0-9]+$ ]] && [ "$ranks_per_node" -ge 1 ] ||
  die "--ranks-per-node '${ranks_per_node}': a whole number >= 1"
[[ "$nics" =~ ^[0-9]+$ ]] && [ "$nics" -ge 1 ] && [ "$nics" -le 4 ] ||
  die "--nics-per-node '$nics': 1 to 4"
[ -n "$link_rate" ] || die "--link-rate RATE is required (e.g. 200mbit, 1gbit)"
[ "$mtu" = auto ] || { [[ "$mtu" =~ ^[0-9]+$ ]] && [ "$mtu" -ge 1280 ] && [ "$mtu" -le 9216 ]; } ||
  die "--mtu '$mtu': auto, or bytes from 1280 to 9216 (1500: plain Ethernet; 9000: jumbo frames)"
link_bits=$(rate_bits_per_s "$link_rate") ||
  die "--link-rate '$link_rate': valid: NUMBER followed by bit, kbit, mbit or gbit (tc's decimal units), e.g. 200mbit"
# Below 1 Mbit/s MPI's launch and wire-up time out; above 40 Gbit/s a veth cannot be shaped
# (veth forwards at about that rate unshaped).
in_range() { awk -v b="$1" 'BEGIN { exit !(b >= 1e6 && b <= 4e10) }'; }
in_range "$link_bits" || die "--link-rate '$link_rate': valid from 1mbit to 40gbit"
uplink_bits=""
if [ -n "$uplink_rate" ]; then
  uplink_bits=$(rate_bits_per_s "$uplink_rate") ||
    die "--uplink-rate '$uplink_rate': valid: NUMBER followed by bit, kbit, mbit or gbit, e.g. 500mbit"
  in_range "$uplink_bits" || die "--uplink-rate '$uplink_rate': valid from 1mbit to 40gbit"
  [ "$nodes" -ge 2 ] && [ $((nodes % 2)) -eq 0 ] ||
    die "--uplink-rate needs an even --nodes, 2 or more (the nodes split over two leaf switches of N/2)"
fi
# auto: jumbo frames from 1 Gbit/s (the NICs' rate), plain Ethernet's below.
[ "$mtu" = auto ] && mtu=$(awk -v b="$link_bits" 'BEGIN { print (b >= 1e9 ? 9000 : 1500) }')
require_tools
cores=$(nproc)
ranks=$((nodes * ranks_per_node))
if [ "$ranks" -gt "$cores" ] && [ "$nodes" -le "$cores" ]; then
  warn "$ranks ranks on $cores cores: each node's $ranks_per_node ranks share its $((cores / nodes)) core(s), and MPI" \
    "yields when idle; compute is time-shared, so compare with a profile measured on this cluster"
elif [ "$ranks" -gt "$cores" ]; then
  warn "$ranks ranks on $cores cores: ranks will share cores and timings will be noise"
fi

config="nodes=$nodes ranks_per_node=$ranks_per_node link_rate=$link_rate nics_per_node=$nics uplink_rate=${uplink_rate:-none} mtu=$mtu"
if cluster_whole && [ "$(cat "$state/config")" = "$config" ] && [ -f "$out/topology.json" ]; then
  say "$name is already up ($config); files in $out"
  exit 0
fi
if [ -f "$made" ]; then
  say "$name: removing the previous cluster or a crashed one's leftovers"
  remove_made
fi

# --- up: build -----------------------------------------------------------------------------------
node_name() { echo "$name-n$1"; }
uts_file() { echo "$state/uts-$(node_name "$1")"; }
leaf_of() {  # a or b: which leaf switch node i hangs from (b only with an uplink)
  if [ -n "$uplink_rate" ] && [ "$1" -ge $(((nodes + 1) / 2)) ]; then echo b; else echo a; fi
}
switch_name() {  # rail k, leaf x
  if [ -n "$uplink_rate" ]; then echo "$name-s$1$2"; else echo "$name-s$1"; fi
}

# tbf on a device's egress. burst: 100 microseconds at the rate, at least 2 full frames of the MTU
# (tbf refuses a bucket below one); latency bounds the queue. A bucket of one millisecond let a
# message after a pause leave at the veth's speed for its first millisecond of bytes (80 KB at
# 0.84 of its time at the rate at 200 Mbit/s, 64-262 KB at 0.56-0.80 at 1 Gbit/s), which no
# NIC does; 100 microseconds keeps large transfers as fast (1.056 and 1.09 of the rate's time for
# 16 MiB, both buckets) and brings 64 KB-1 MiB to 0.97-1.10 (bench/netns_link.sh; MTU 1500).
# With MTU 1500 the 2-core VM's forwarding (veth, bridge, tbf's segmenting) could not keep up at
# 1 Gbit/s: MPI's ping-pong got 0.64-0.73 of the rate (0.35 without GSO), and a collective
# 0.53-0.75, varying run to run; MTU 9000 with its two-frame bucket (18.2 KB): 0.99 and 0.93-0.95
# at 1 Gbit/s, 0.99 and 0.98 at 200 Mbit/s (TCP/IP and Ethernet headers alone leave 8948/9014 =
# 0.993). A one-frame bucket loses tokens (0.93 at 200 Mbit/s, 0.77 at 1 Gbit/s). The price at
# 200 Mbit/s: a message after a pause gets the bucket at once (16 KiB in 0.06 of its time at the
# rate, 64 KB 0.76, 256 KB 0.96, 600 KB and more 1.00-1.03), and the netns sweep's small-message
# points there came out +11% and +14% (+3% and -2% at 1500): hence --mtu auto.
# NETNS: the node whose device it is, or empty (this host).
shape() {
  local netns=$1 dev=$2 bits=$3 rate=$4 burst msg
  burst=$(awk -v b="$bits" -v m="$mtu" 'BEGIN { x = b / 8 / 10000; if (x < 2 * (m + 100)) x = 2 * (m + 100); printf "%d", x }')
  msg=$(ip ${netns:+-n "$netns"} link show dev "$dev" >/dev/null &&
    ${netns:+ip netns exec "$netns"} tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 200ms 2>&1) ||
    fail_up "tc refuses rate '$rate' on ${netns:+$netns }$dev: $msg"
}

if [ -n "$(ip -4 addr show to "$subnet_prefix.0.0/16" 2>/dev/null)" ]; then
  die "this host already has an address in $subnet_prefix.0.0/16 (the subnet of cluster '$name'): another --name picks another subnet"
fi
mkdir -p "$state"
: >"$made"
for ((k = 0; k < nics; k++)); do
  for x in a b; do
    [ "$x" = b ] && [ -z "$uplink_rate" ] && continue
    sw=$(switch_name "$k" "$x")
    claim link "$sw"
    ip link add "$sw" mtu "$mtu" type bridge 2>/dev/null || fail_up "cannot make bridge $sw"
    # The bridge forwards at once (no STP learning delay) and filters nothing.
    ip link set "$sw" type bridge stp_state 0 forward_delay 0 2>/dev/null || true
    ip link set "$sw" up
  done
  if [ -n "$uplink_rate" ]; then
    ua="$name-u${k}a" ub="$name-u${k}b"
    claim link "$ua"; claim link "$ub"
    ip link add "$ua" mtu "$mtu" type veth peer name "$ub" mtu "$mtu" || fail_up "cannot make uplink $ua-$ub"
    ip link set "$ua" master "$(switch_name "$k" a)" up
    ip link set "$ub" master "$(switch_name "$k" b)" up
    shape "" "$ua" "$uplink_bits" "$uplink_rate"
    shape "" "$ub" "$uplink_bits" "$uplink_rate"
  fi
done
# This host's address on rail 0 (leaf a): mpirun's daemons call back to it.
ip addr add "$subnet_prefix.0.254/24" dev "$(switch_name 0 a)"

for ((i = 0; i < nodes; i++)); do
  node=$(node_name "$i")
  claim netns "$node"
  ip netns add "$node" 2>/dev/null || fail_up "cannot make network namespace $node"
  uts=$(uts_file "$i")
  claim uts "$uts"
  touch "$uts"
  unshare --uts="$uts" hostname "$node" || fail_up "cannot make the UTS namespace of $node"
  ip -n "$node" link set lo up
  for ((k = 0; k < nics; k++)); do
    host_end="$name-$i-$k"
    claim link "$host_end"
    ip link add "$host_end" mtu "$mtu" type veth peer name "nic$k" mtu "$mtu" netns "$node" ||
      fail_up "cannot make veth $host_end"
    ip link set "$host_end" master "$(switch_name "$k" "$(leaf_of "$i")")" up
    ip -n "$node" addr add "$subnet_prefix.$k.$((i + 1))/24" dev "nic$k"
    ip -n "$node" link set "nic$k" up
    shape "" "$host_end" "$link_bits" "$link_rate"   # switch -> node
    shape "$node" "nic$k" "$link_bits" "$link_rate"  # node -> switch
  done
done
# Each node its own cores (the agent pins its daemon, and so its ranks, to them), as separate
# hosts would have. With more ranks than cores but no more nodes, each node still gets cores of
# its own (cores / nodes) and its ranks share them; the mpirun wrapper then has MPI yield when idle
# (mpi_yield_when_idle), so that a rank waiting in a collective gives its core to the node's
# computing one. Measured on 2 cores, tiny tp 2 × dp 2 on 2 nodes of 2 ranks at 100 Mbit/s: 162–169
# ms a step in 5 runs (steps within ±5%), its compute as a profile on the same cluster predicts
# (29.2 ms against 28.4–29.4); with every rank on every core and MPI spinning, the same plan's
# tensor-parallel all-reduces took 15 ms in one run and 102 ms in another. More nodes than cores:
# they share all of them.
if [ "$ranks" -le "$cores" ]; then
  for ((i = 0; i < nodes; i++)); do
    echo "$((i * ranks_per_node))-$((i * ranks_per_node + ranks_per_node - 1))" >"$state/cpus-$(node_name "$i")"
  done
elif [ "$nodes" -le "$cores" ]; then
  per_node=$((cores / nodes))
  for ((i = 0; i < nodes; i++)); do
    echo "$((i * per_node))-$((i * per_node + per_node - 1))" >"$state/cpus-$(node_name "$i")"
  done
fi
yield=""
[ "$ranks" -gt "$cores" ] && yield="args+=(--mca mpi_yield_when_idle 1)  # more ranks than cores: share them"

echo "$config" >"$state/config"

# --- measure the one-way latency (ping, node 0 -> the last node, rail 0) ----------------------
latency_s="" latency_note=""
if [ "$nodes" -ge 2 ] && command -v ping >/dev/null; then
  target="$subnet_prefix.0.$nodes"
  ip netns exec "$(node_name 0)" ping -c 3 -W 2 -q "$target" >/dev/null 2>&1 ||
    fail_up "node 0 cannot reach $target over the cluster's switch"
  rtt=$(ip netns exec "$(node_name 0)" ping -c 200 -i 0.002 -q "$target" 2>/dev/null |
    awk -F'[/ ]+' '/^rtt/ { print $8 }')   # the mean round trip, ms
  latency_s=$(awk -v r="$rtt" 'BEGIN { printf "%.3g", r / 1000 / 2 }')
  latency_note="one-way latency ${latency_s} s = half the mean ICMP round trip (ping, 200 probes, node 0 to node $((nodes - 1)), 56-byte payload)"
else
  latency_s=5e-5
  latency_note="latency not measured ($([ "$nodes" -lt 2 ] && echo "one node" || echo "no ping: apt-get install iputils-ping")): 50 us assumed"
fi

# --- files ---------------------------------------------------------------------------------------
mkdir -p "$out"
: >"$out/hostfile"
for ((i = 0; i < nodes; i++)); do echo "$(node_name "$i") slots=$ranks_per_node" >>"$out/hostfile"; done

# The topology: the shaped NIC rate in bytes/s; the NIC latency is half the one-way latency (two
# NICs on a path), the bridge counted as a switch of no latency. One leaf per rail (radix 2·N
# ports, half of them down) without an uplink. With one, two leaves of N/2 nodes joined by one
# link: a dragonfly of two groups of one router each, whose global link is the uplinks (one a
# rail). (A fat tree cannot say it: its leaves hold radix/2 NICs, and N NICs on a radix of N make
# one switch, which has no uplink to oversubscribe.)
radix=$((2 * nodes))
[ "$radix" -ge 2 ] || radix=2
fabric_shape="\"oversubscription\": 1,
    \"switch_radix\": $radix"
if [ -n "$uplink_rate" ]; then
  uplinks_bytes=$(awk -v u="$uplink_bits" -v k="$nics" 'BEGIN { printf "%.6g", u / 8 * k }')
  fabric_shape="\"groups\": 2,
    \"routers_per_group\": 1,
    \"nodes_per_router\": $((nodes / 2)),
    \"local_link_bandwidth_bytes_per_s\": $uplinks_bytes,
    \"local_link_latency_s\": 0,
    \"global_link_bandwidth_bytes_per_s\": $uplinks_bytes,
    \"global_link_latency_s\": 0"
fi
mem_bytes=$(awk '/^MemTotal/ { print $2 * 1024 }' /proc/meminfo)
device_mem=$(awk -v m="$mem_bytes" -v r="$ranks" 'BEGIN { printf "%.0f", m / 2 / r }')
kind=fat_tree
if [ "$nics" -gt 1 ] && [ "$nics" -eq "$ranks_per_node" ]; then kind=rail_optimized; fi
[ -n "$uplink_rate" ] && kind=dragonfly
nic_bytes=$(awk -v b="$link_bits" 'BEGIN { printf "%.6g", b / 8 }')
nic_latency=$(awk -v l="$latency_s" 'BEGIN { printf "%.3g", l / 2 }')
cat >"$out/topology.json" <<EOF
{
  "name": "netns-$name",
  "notes": "Written by scripts/netns-cluster.sh up ($config): $nodes network namespaces on this host, each its own hostname, $nics veth NIC(s) each on a Linux bridge per rail$( [ -n "$uplink_rate" ] && echo ", the nodes split over two leaf bridges per rail joined by a veth uplink shaped at $uplink_rate")). Every NIC is shaped by tc tbf at $link_rate in both directions (nic_bandwidth_bytes_per_s = the shaped rate; TCP's achievable share of it is the profile's to measure). $latency_note; nic_latency_s is half of it, the bridge a switch of no latency. Devices as topologies/localhost-cpu.json: one rank per core ($ranks ranks on $cores cores), memory_bytes = half of this host's memory over the ranks.",
  "num_nodes": $nodes,
  "node": {
    "devices_per_node": $ranks_per_node,
    "device": {
      "name": "cpu-core",
      "peak_flops_per_s": {"fp64": 50e9, "fp32": 100e9},
      "memory_bytes": $device_mem,
      "memory_bandwidth_bytes_per_s": 10e9,
      "runtime_allowance_bytes": 268435456,
      "memory_reserved_bytes": 0
    },
    "intra_node": {"kind": "shared_memory", "bandwidth_bytes_per_s": 5e9, "latency_s": 1e-6}
  },
  "fabric": {
    "kind": "$kind",
    "nics_per_node": $nics,
    "nic_bandwidth_bytes_per_s": $nic_bytes,
    "nic_latency_s": $nic_latency,
    "switch_latency_s": 0,
    $fabric_shape
  }
}
EOF

# OpenMPI across the nodes: the agent enters a node's namespaces; TCP (and the daemons' out-of-band
# channel) on the cluster's subnet only; no shared memory between nodes (separate hostnames).
# TCP without the BTL's emulated RDMA put (btl_tcp_flags less `put`, unless the caller sets them):
# with put, a message above the eager limit goes as one fragment, and two ranks sending to each
# other at once (every ring step of a 2-member collective) can take turns on their connection:
# small-gpt pp 2's 8.4 MB tied-embedding all-reduce at 200 Mbit/s took 700 ms with put and 430
# without, in every run (bench/netns_put.sh); the link itself is full duplex.
cat >"$out/mpirun" <<EOF
#!/usr/bin/env bash
# mpirun across the netns cluster '$name' (scripts/netns-cluster.sh): its hostfile, its launcher
# agent, TCP on its subnet; otherwise as scripts/mpirun.
set -euo pipefail
export OPENBLAS_NUM_THREADS=\${OPENBLAS_NUM_THREADS:-1}
args=(--hostfile "$out/hostfile" --mca plm_rsh_agent "$repo/scripts/netns-cluster.sh agent"
      --mca btl self,vader,tcp --mca btl_tcp_if_include $subnet_prefix.0.0/16
      --mca oob_tcp_if_include $subnet_prefix.0.0/16 -x OPENBLAS_NUM_THREADS)
[ "\$(id -u)" -eq 0 ] && args+=(--allow-run-as-root)
case " \$* " in *" --bind-to "*) ;; *) args+=(--bind-to none) ;; esac
case " \$* " in *" btl_tcp_flags "*) ;; *) args+=(--mca btl_tcp_flags send,inplace,need-ack,need-csum) ;; esac
$yield
for v in STEPCAST_TRACE_OPS STEPCAST_TEST_HANG STEPCAST_TEST_DIE STEPCAST_TEST_SIM_DIE; do
  [ -n "\${!v:-}" ] && args+=(-x "\$v")
done
exec mpirun "\${args[@]}" "\$@"
EOF
chmod +x "$out/mpirun"
cat >"$out/cluster.env" <<EOF
STEPCAST_NETNS_NAME=$name
STEPCAST_NETNS_NODES=$nodes
STEPCAST_NETNS_RANKS_PER_NODE=$ranks_per_node
STEPCAST_NETNS_LINK_RATE=$link_rate
STEPCAST_NETNS_LINK_BITS_PER_S=$link_bits
STEPCAST_NETNS_UPLINK_RATE=${uplink_rate}
STEPCAST_NETNS_LATENCY_S=$latency_s
EOF
say "$name is up: $config; one-way latency ${latency_s} s"
say "files: $out/{hostfile,topology.json,mpirun,cluster.env}"
say "run:   $out/mpirun -np $ranks build/stepcast run ... --topology $out/topology.json"
