#!/bin/bash
# Usage: xtask/scripts/first-connect.sh [N]  (after cargo build --release; N fresh client processes per transport)
# first connect of fresh processes: SMC vs TCP, interleaved; prints medians of connect_us[0]
B=${B:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
D=$(mktemp -d); export SMCD_SOCKET=$D/smcd.sock
$B/smcd --socket $D/smcd.sock >$D/smcd.log 2>&1 & SMCD=$!
sleep 0.5
$B/smc-perf server --port 17801 >$D/s1.log 2>&1 & S1=$!
$B/smc-perf server --tcp --port 17802 >$D/s2.log 2>&1 & S2=$!
sleep 0.5
for i in $(seq 1 ${1:-21}); do
  $B/smc-perf client --test crr --count 2 127.0.0.1:17801 | python3 -c 'import json,sys; j=json.load(sys.stdin); print("smc", *j["connect_us"])'
  $B/smc-perf client --tcp --test crr --count 2 127.0.0.1:17802 | python3 -c 'import json,sys; j=json.load(sys.stdin); print("tcp", *j["connect_us"])'
done > $D/out
python3 - $D/out <<'PY'
import sys,statistics as st
r={}
for l in open(sys.argv[1]):
    k,*v=l.split(); r.setdefault(k,[]).append([int(x) for x in v])
for k,v in r.items():
    print(k, "first: median %d us" % st.median(x[0] for x in v), "second: median %d us" % st.median(x[1] for x in v if len(x)>1), "n=%d"%len(v))
PY
kill $S1 $S2 $SMCD; wait 2>/dev/null
