#!/bin/bash
# Usage: [TCP=1] [EV=1] xtask/scripts/wakeups.sh [CONCURRENCY]  (after cargo build --release; EV=1: smc-perf --events on both sides): one crr run of 3 s,
# wake-ups (voluntary context switches) per connection of the client, the server by thread
# name and smcd
# per-thread wake-ups (voluntary switches) of the server and smcd during one crr run
B=${B:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
D=$(mktemp -d); export SMCD_SOCKET=$D/smcd.sock
$B/smcd --socket $D/smcd.sock >$D/smcd.log 2>&1 & SMCD=$!
sleep 0.5
$B/smc-perf server ${TCP:+--tcp} ${EV:+--events} --port 17811 --pin 1 2>$D/srv.log & SRV=$!
sleep 0.5
snap() { for t in /proc/$1/task/*; do echo "$(cat $t/comm | tr ' ' _) $(awk '/^voluntary_ctxt/{print $2}' $t/status)"; done | awk '{a[$1]+=$2} END {for (k in a) print k, a[k]}' | sort; }
kill -USR1 $SRV $SMCD; sleep 0.2
snap $SRV > $D/s0; snap $SMCD > $D/d0
$B/smc-perf client ${TCP:+--tcp} ${EV:+--events} --test crr --concurrency ${1:-8} --time 3 --pin 0 127.0.0.1:17811 > $D/cli.json
snap $SRV > $D/s1; snap $SMCD > $D/d1
kill -USR1 $SRV $SMCD; sleep 0.2
python3 - $D <<'PY'
import sys,json,re
d=sys.argv[1]
c=json.load(open(d+"/cli.json")); n=c["total_connections"]
def rus(f,tag):
    v=[int(m.group(1)) for m in re.finditer(tag+r': rusage \{"voluntary":(\d+)',open(f).read())]
    return v[-1]-v[-2]
def th(a,b):
    A=dict(l.split() for l in open(a)); Bm=dict(l.split() for l in open(b))
    return {k:(int(Bm[k])-int(A.get(k,0)))/n for k in Bm}
print("connections", n, "conn/s %.0f"%c["conns_per_s"], c["mode"])
print("client total %.2f per connection" % (c["csw_voluntary"]/n))
for name,f,tag,a,b in [("server",d+"/srv.log","smc-perf","s0","s1"),("smcd",d+"/smcd.log","smcd","d0","d1")]:
    tot=rus(f,tag)/n; t=th(d+"/"+a,d+"/"+b); live=sum(t.values())
    print("%s total %.2f per connection; live threads: %s; exited threads: %.2f" % (name,tot,", ".join("%s %.2f"%(k,v) for k,v in sorted(t.items(), key=lambda x:-x[1]) if v>=0.01), tot-live))
PY
kill $SRV $SMCD; wait 2>/dev/null
