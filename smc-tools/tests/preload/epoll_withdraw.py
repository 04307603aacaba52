"""An event loop woken from its epoll_wait takes back what its streams announced before it
slept (smc-preload: table::withdraw, SmcConn::withdraw_readiness), so that while it is busy its
peers' writes ring nobody: their readiness sockets stay empty (the receive queue `ss -x` shows,
asked from the kernel's sock_diag; a stream that was rung shows its byte, which checks the
reading), and every arrival is still reported, from shared memory. A thread that waits in the
kernel is never left without a ring: one asleep in another set when the loop wakes keeps the
announcements (nothing is taken back), one that starts to wait afterwards has them made again.
Threads are known to be asleep in the kernel by /proc/self/task/TID/syscall. Run under smc-run
with smcd up; the last line is "OK <n> connections"."""
import os
import select
import socket
import threading

import waits
from epoll_pairs import drain, made, pair

IN = select.EPOLLIN
N = 8


def asleep(tid):
    """Waits until thread `tid` of this process sleeps in a wait on descriptors."""
    waits.asleep(os.getpid(), tid)


def queued(socks):
    """The receive queue of the readiness socket at each of `socks`' numbers."""
    return waits.queued([os.fstat(s.fileno()).st_ino for s in socks])


def woken_by(ep, c, s, data):
    """The loop sleeps in the kernel's epoll_wait with nothing ready, and a write to `c` from
    another thread wakes it; returns what it was told."""
    main = threading.get_native_id()

    def write():
        asleep(main)
        c.sendall(data)

    t = threading.Thread(target=write)
    t.start()
    evs = ep.poll(10)
    t.join()
    assert evs == [(s.fileno(), IN)], evs
    assert drain(s) == data
    return evs


lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.bind(("127.0.0.1", 0))
lst.listen(16)
pairs = [pair(lst) for _ in range(N)]
ep = select.epoll()
for _, s in pairs:
    ep.register(s.fileno(), IN)
servers = [s for _, s in pairs]

# Busy rounds first (answered in user space, probes of the kernel between them).
for rnd in range(50):
    for i, (c, _) in enumerate(pairs):
        c.sendall(b"w%d-%d" % (rnd, i))
    seen = set()
    while len(seen) < N:
        for fd, ev in ep.poll(5):
            i = servers.index(next(s for s in servers if s.fileno() == fd))
            assert drain(servers[i]) == b"w%d-%d" % (rnd, i)
            seen.add(i)
    assert ep.poll(0) == []

for rnd in range(5):
    # Asleep with every stream announced, woken by stream 0's ring.
    c0, s0 = pairs[0]
    woken_by(ep, c0, s0, b"wake %d" % rnd)
    # Busy now: stream 0 is rung again (its read settled it before), the others not: their
    # announcements were taken back when the loop woke.
    for i, (c, _) in enumerate(pairs[1:], 1):
        c.sendall(b"busy %d-%d" % (rnd, i))
    q = queued(servers[1:])
    assert q == [0] * (N - 1), f"round {rnd}: bells rung for a busy loop: {q}"
    # Every arrival is reported all the same, once, with its bytes.
    want = set(range(1, N))
    while want:
        evs = ep.poll(5)
        assert evs, f"round {rnd}: {want} not reported"
        for fd, ev in evs:
            i = next(k for k, s in enumerate(servers) if s.fileno() == fd)
            assert i in want, f"round {rnd}: stream {i} reported twice"
            assert drain(servers[i]) == b"busy %d-%d" % (rnd, i)
            want.discard(i)
    assert ep.poll(0) == [], f"round {rnd}: readable after everything was read"

# The positive control for queued(): a stream announced and written to while nothing took
# its announcement back holds the bell's byte (here: after the loop slept, from a second set
# whose wait does not take anything back, written while the loop is in that wait).
c6, s6 = pairs[6]
ep6 = select.epoll()
ep6.register(s6.fileno(), IN)
assert ep6.poll(0) == []
main = threading.get_native_id()


def write6():
    asleep(main)
    c6.sendall(b"rung")
    # The loop is still in its wait, or just woke: the ring came first either way.
    assert queued([s6]) == [1], "the ring's byte"


t = threading.Thread(target=write6)
t.start()
assert ep6.poll(10) == [(s6.fileno(), IN)]
t.join()
assert drain(s6) == b"rung"
assert ep.poll(0) == []

# A thread that waits in the kernel after the loop took its announcements back (select on
# one stream) is woken: its wait settles them first.
c3, s3 = pairs[3]
woken_by(ep, *pairs[0], b"before select")
got = []
sel = threading.Thread(target=lambda: got.append(select.select([s3], [], [], 10)[0]))
sel.start()
asleep(sel.native_id)
c3.sendall(b"to select")
sel.join()
assert got == [[s3]], got
assert drain(s3) == b"to select"

# A thread asleep in another set when the loop wakes: nothing is taken back, and a write to
# its stream wakes it.
c5, s5 = pairs[5]
ep2 = select.epoll()
ep2.register(s5.fileno(), IN)
got2 = []
b = threading.Thread(target=lambda: got2.append(ep2.poll(10)))
b.start()
asleep(b.native_id)
woken_by(ep, *pairs[0], b"while another sleeps")
c5.sendall(b"to the sleeper")
b.join()
assert got2 == [[(s5.fileno(), IN)]], got2
assert drain(s5) == b"to the sleeper"
assert ep.poll(0) == []

print(f"OK {made()} connections", flush=True)
