#!/bin/bash
# Usage: [EV=1] xtask/scripts/crr-syscalls.sh [CONCURRENCY] [tcp]  (after cargo build --release)
# System calls per connection of each side of a 2 s crr run (strace -c -f; strace slows the
# run, the counts per connection are what matters).
B=${B:-$(cd "$(dirname "$0")/../.." && pwd)/target/release}
D=$(mktemp -d); export SMCD_SOCKET=$D/smcd.sock
$B/smcd --socket $D/smcd.sock >$D/smcd.log 2>&1 & SMCD=$!
sleep 0.4
T=; [ "$2" = tcp ] && T=--tcp
$B/smc-perf server $T ${EV:+--events} --port 17814 --pin 1 2>$D/srv.log & SRV=$!
sleep 0.4
strace -c -f -p $SRV -o $D/srv.st & S=$!
sleep 0.3
strace -c -f -o $D/cli.st $B/smc-perf client $T ${EV:+--events} --test crr --concurrency ${1:-8} --time 2 --pin 0 127.0.0.1:17814 > $D/cli.json 2>/dev/null
kill -INT $S; wait $S
n=$(python3 -c "import json;print(json.load(open('$D/cli.json'))['total_connections'])")
echo "connections $n"
for s in cli srv; do echo "== $s"; awk -v n=$n '$1 ~ /^[0-9.]+$/ && NF>=5 {name=$NF; calls=$4; printf "%-22s %6.2f\n", name, calls/n}' $D/$s.st | sort -k2 -nr | head -25; done
kill $SRV $SMCD; wait 2>/dev/null
