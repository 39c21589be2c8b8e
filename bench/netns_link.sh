#!/usr/bin/env bash
# What one shaped link of the netns cluster does with a message after a pause (issue 21): a
# 2-node cluster (scripts/netns-cluster.sh, one rank per node) at RATE, a TCP connection between
# the nodes (TCP_NODELAY), and for each size a message sent 10 ms after the last, timed from the
# first byte written to the receiver's one-byte reply; the median of 5 against the size's time at
# the shaped rate. A ratio under 1 is a burst (tbf's bucket refilled in the pause and spent at
# the veth's speed); a constant ratio over every size is a constant-rate link (TCP/IP and
# Ethernet headers alone are 9014/8948 = 1.007 at the cluster's MTU 9000, 1514/1448 = 1.046 at
# 1500). BUCKET_US (default: the cluster's own) reshapes every NIC with a bucket of that many
# microseconds at the rate before measuring. Needs root; under a minute. RATE (default 200mbit),
# MTU (default auto, the cluster's).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${RATE:-200mbit}
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces): run as root"; exit 1; }
out=$(mktemp -d)
name=sclink
trap 'bash scripts/netns-cluster.sh down --name $name >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
bash scripts/netns-cluster.sh up --nodes 2 --ranks-per-node 1 --link-rate "$rate" --mtu "${MTU:-auto}" --name $name \
  --out "$out/cluster" >/dev/null
rate_bytes=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['fabric']['nic_bandwidth_bytes_per_s'])" \
  "$out/cluster/topology.json")
reshape() {  # NETNS ("" for this host) DEV: a tbf of BUCKET_US at the rate
  local burst
  burst=$(awk -v r="$rate_bytes" -v u="$BUCKET_US" -v m="$mtu" 'BEGIN { x = r * u / 1e6; if (x < 2 * (m + 100)) x = 2 * (m + 100); printf "%d", x }')
  ${1:+ip netns exec "$1"} tc qdisc replace dev "$2" root tbf rate "$rate" burst "$burst" latency 200ms
}
mtu=$(ip -o link show dev "$name-s0" | sed 's/.* mtu \([0-9]*\).*/\1/')  # the cluster's (netns-cluster.sh --mtu)
links() { ip ${1:+-n "$1"} -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }'; }
if [ -n "${BUCKET_US:-}" ]; then
  for ns in $(ip netns list | awk -v n="$name-n" 'index($1, n) == 1 { print $1 }'); do
    for dev in $(links "$ns" | grep '^nic'); do reshape "$ns" "$dev"; done
  done
  for dev in $(links "" | grep "^$name-[0-9]"); do reshape "" "$dev"; done
fi
nodes=($(ip netns list | awk -v n="$name-" 'index($1, n) == 1 { print $1 }' | sort))
server_ip=$(ip -n "${nodes[1]}" -4 -o addr show dev nic0 | awk '{ sub(/\/.*/, "", $4); print $4 }')
cat >"$out/probe.py" <<'PY'
import socket, sys, time
def recvall(c, n):
    got = 0
    while got < n:
        b = c.recv(min(1 << 20, n - got))
        if not b: raise SystemExit
        got += len(b)
if sys.argv[1] == 'server':
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[2], 5555)); s.listen(1); c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        h = c.recv(8, socket.MSG_WAITALL)
        if len(h) < 8: break
        recvall(c, int.from_bytes(h, 'little')); c.sendall(b'k')
else:
    c = socket.create_connection((sys.argv[2], 5555))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rate = float(sys.argv[3])
    print('%10s %12s %12s %7s' % ('bytes', 'median ms', 'at rate ms', 'ratio'))
    for n in [1 << 14, 1 << 16, 80000, 1 << 18, 600000, 1 << 20, 1 << 22, 1 << 24]:
        ts = []
        for _ in range(5):
            time.sleep(0.01)
            t = time.perf_counter(); c.sendall(n.to_bytes(8, 'little') + b'x' * n); c.recv(1)
            ts.append(time.perf_counter() - t)
        m = sorted(ts)[2]
        print('%10d %12.3f %12.3f %7.3f' % (n, m * 1e3, n / rate * 1e3, m / (n / rate)))
PY
echo "link $rate: $(tc qdisc show dev "$(links "" | grep "^$name-[0-9]" | head -1)" | grep -o 'burst [0-9]*[a-zA-Z]*')"
ip netns exec "${nodes[1]}" python3 "$out/probe.py" server "$server_ip" &
sleep 0.5
ip netns exec "${nodes[0]}" python3 "$out/probe.py" client "$server_ip" "$rate_bytes"
wait
