#!/usr/bin/env bash
# What a shaped link of the netns cluster gives a transfer one way against both ways at once
# (issue 21: a collective's ranks send and receive at once; a ping-pong sends one way at a time):
# a 2-node cluster (scripts/netns-cluster.sh, one rank per node) at RATE, optionally behind an
# uplink of UPLINK (the nodes on two leaves), a TCP connection between the nodes (TCP_NODELAY),
# and for 4 and 16 MiB the median of 7 transfers one way (timed to the receiver's one-byte reply)
# and both ways at once (each side a sending thread and a receiving one), as a fraction of the
# shaped rate (UPLINK's where given): bytes each way over the time. TCP/IP and Ethernet headers
# alone leave 1448/1514 = 0.956 one way; both ways, each direction also carries the other's pure
# acknowledgements. Needs root; about a minute. RATE (default 200mbit), UPLINK (default none).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${RATE:-200mbit}
uplink=${UPLINK:-}
[ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces): run as root"; exit 1; }
out=$(mktemp -d)
name=scbidir
trap 'bash scripts/netns-cluster.sh down --name $name >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
bash scripts/netns-cluster.sh up --nodes 2 --ranks-per-node 1 --link-rate "$rate" ${uplink:+--uplink-rate "$uplink"} \
  --name $name --out "$out/cluster" >/dev/null
bottleneck=$(python3 -c "
import json, sys
f = json.load(open(sys.argv[1]))['fabric']
print(min(f['nic_bandwidth_bytes_per_s'], f.get('global_link_bandwidth_bytes_per_s', float('inf'))))" \
  "$out/cluster/topology.json")
nodes=($(ip netns list | awk -v n="$name-" 'index($1, n) == 1 { print $1 }' | sort))
server_ip=$(ip -n "${nodes[1]}" -4 -o addr show dev nic0 | awk '{ sub(/\/.*/, "", $4); print $4 }')
cat >"$out/probe.py" <<'PY'
import socket, sys, threading, time
def send(c, n):
    block = b'\0' * (1 << 20)
    while n > 0:
        n -= c.send(block[:min(n, len(block))])
def recv(c, n):
    while n > 0:
        b = c.recv(min(1 << 20, n))
        if not b: raise SystemExit
        n -= len(b)
def both(c, n):
    t = threading.Thread(target=send, args=(c, n)); t.start(); recv(c, n); t.join()
if sys.argv[1] == 'server':
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[2], 5556)); s.listen(1); c, _ = s.accept()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        h = c.recv(9, socket.MSG_WAITALL)
        if len(h) < 9: break
        n = int.from_bytes(h[1:], 'little'); c.sendall(b'k')
        if h[:1] == b'1': recv(c, n); c.sendall(b'k')
        else: both(c, n)
else:
    c = socket.create_connection((sys.argv[2], 5556))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rate = float(sys.argv[3])
    print('%10s %10s %12s %9s' % ('bytes', 'way', 'median ms', 'fraction'))
    for n in [1 << 22, 1 << 24]:
        for way in (b'1', b'2'):
            ts = []
            for _ in range(7):
                time.sleep(0.05)
                c.sendall(way + n.to_bytes(8, 'little')); recv(c, 1)
                t = time.perf_counter()
                if way == b'1': send(c, n); recv(c, 1)
                else: both(c, n)
                ts.append(time.perf_counter() - t)
            m = sorted(ts)[3]
            print('%10d %10s %12.3f %9.3f' % (n, 'one' if way == b'1' else 'both', m * 1e3, n / rate / m))
PY
echo "link $rate${uplink:+, uplink $uplink}: fraction of $bottleneck B/s"
ip netns exec "${nodes[1]}" python3 "$out/probe.py" server "$server_ip" &
sleep 0.5
ip netns exec "${nodes[0]}" python3 "$out/probe.py" client "$server_ip" "$bottleneck"
wait
