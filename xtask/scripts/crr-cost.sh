#!/bin/bash
# Usage: [EV=1] [SECS=3] [STATS=1] [B=dir] xtask/scripts/crr-cost.sh [CONCURRENCY] [tcp]  (after cargo build --release)
# One crr run with its own smcd: server pinned to CPU 1, client to CPU 0; prints conn/s, the
# SMC-D share, errors, CPU time per connection of each side and the client's voluntary
# context switches per connection. EV=1: smc-perf --events on both sides; STATS=1: smcctl -d stats.
B=${B:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
D=$(mktemp -d); export SMCD_SOCKET=$D/smcd.sock
$B/smcd --socket $D/smcd.sock >$D/smcd.log 2>&1 & SMCD=$!
sleep 0.4
T=; [ "$2" = tcp ] && T=--tcp
$B/smc-perf server $T ${EV:+--events} --port 17812 --pin 1 2>$D/srv.log & SRV=$!
sleep 0.4
c0=$(awk '{print $14+$15}' /proc/$SRV/stat)
/usr/bin/time -f "%U %S" -o $D/time $B/smc-perf client $T ${EV:+--events} --test crr --concurrency ${1:-8} --time ${SECS:-3} --pin 0 127.0.0.1:17812 > $D/cli.json 2>$D/cli.err
c1=$(awk '{print $14+$15}' /proc/$SRV/stat)
[ -n "$STATS" ] && $B/smcctl -d stats
python3 - $D $c0 $c1 <<'PY'
import sys,json
d=sys.argv[1]; c=json.load(open(d+"/cli.json")); n=c["total_connections"]
u,s=map(float,open(d+"/time").read().split()[-2:])
srv=(int(sys.argv[3])-int(sys.argv[2]))*10000/n
print("conn/s %.0f, %s, errors %s, CPU per connection: client %.1f us, server %.1f us; client wake-ups per connection %.2f" % (c["conns_per_s"], c["mode"], c.get("errors"), (u+s)*1e6/n, srv, c.get("csw_voluntary",0)/n))
PY
kill $SRV $SMCD; wait 2>/dev/null
