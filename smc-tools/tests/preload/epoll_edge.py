"""Edge-triggered and one-shot epoll registrations of SMC streams (smc-preload/src/ep.rs), run
under smc-run with smcd up.

Both ends in this process. The server ends are registered as nginx registers its connections
(EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET), in a set that also holds a pipe and a one-shot
stream. Checks that an edge-triggered stream is reported once when it is registered (room to
write), once per arrival of bytes (not again while they wait, again when more arrive, never
twice for one arrival under a busy loop), again for room after a write found the buffer
full, and with EPOLLRDHUP at the end of stream; that the pipe is still reported while streams
keep arriving; and that a one-shot stream is reported once and then not again until
EPOLL_CTL_MOD re-arms it. The last line printed is "OK <n> connections".
"""
import os
import select
import socket

from epoll_pairs import drain, made, pair

IN, OUT, RDHUP = select.EPOLLIN, select.EPOLLOUT, select.EPOLLRDHUP
ET, ONESHOT = select.EPOLLET, select.EPOLLONESHOT
NGINX = IN | OUT | RDHUP | ET


def quiet(ep, what, calls=20):
    """Nothing is reported in `calls` calls (some answered in user space, some by the kernel)."""
    for k in range(calls):
        evs = ep.poll(0)
        assert evs == [], f"{what}: call {k} reported {evs}"


lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.bind(("127.0.0.1", 0))
lst.listen(16)
pairs = [pair(lst) for _ in range(4)]
rp, wp = os.pipe()
ep = select.epoll()
for _, s in pairs:
    ep.register(s.fileno(), NGINX)
ep.register(rp, IN)
by_fd = {s.fileno(): i for i, (_, s) in enumerate(pairs)}

# Registered: each stream once, with room to write, then nothing.
seen = {}
for _ in range(10):
    for fd, ev in ep.poll(0.2):
        assert fd in by_fd, f"not a stream: {fd}"
        assert fd not in seen, f"stream {by_fd[fd]} reported twice after its registration"
        seen[fd] = ev
    if len(seen) == len(pairs):
        break
assert all(ev == OUT for ev in seen.values()), seen
assert len(seen) == len(pairs), seen
quiet(ep, "after the registration")

# One arrival: one report; not again while the bytes wait; again when more arrive.
c0, s0 = pairs[0]
c0.sendall(b"x")
evs = ep.poll(5)
assert [fd for fd, _ in evs] == [s0.fileno()], evs
assert evs[0][1] & IN, evs
quiet(ep, "bytes not read yet, nothing new")
c0.sendall(b"y")
evs = ep.poll(5)
assert [fd for fd, _ in evs] == [s0.fileno()], evs
assert evs[0][1] & IN, evs
assert drain(s0) == b"xy"
quiet(ep, "after the read")

# A busy event loop: each arrival is reported once, never a stream with nothing new.
for rnd in range(300):
    want = {i for i in range(len(pairs)) if (rnd + i) % 3 != 0}
    for i in sorted(want):
        pairs[i][0].sendall(b"r%03d-%d" % (rnd, i))
    got = set()
    while got != want:
        evs = ep.poll(5)
        assert evs, f"round {rnd}: nothing reported, {want - got} have bytes"
        for fd, ev in evs:
            assert fd != rp, "the pipe is empty"
            i = by_fd[fd]
            assert ev & IN, (rnd, i, ev)
            assert i in want, f"round {rnd}: stream {i} reported, nothing sent to it"
            assert i not in got, f"round {rnd}: stream {i} reported twice for one arrival"
            assert drain(pairs[i][1]) == b"r%03d-%d" % (rnd, i), (rnd, i)
            got.add(i)
quiet(ep, "after the busy loop")

# The pipe is reported while streams keep arriving (the kernel is asked every few calls).
os.write(wp, b"p")
calls = 0
while True:
    calls += 1
    assert calls <= 50, "the pipe was not reported in 50 calls"
    pairs[calls % len(pairs)][0].sendall(b"z")
    evs = dict(ep.poll(5))
    for fd in list(evs):
        if fd in by_fd:
            drain(pairs[by_fd[fd]][1])
    if rp in evs:
        break
assert os.read(rp, 1) == b"p"
for _ in range(3):
    for fd, _ in ep.poll(0.05):
        drain(pairs[by_fd[fd]][1])
quiet(ep, "after the pipe")

# Room after a write found the buffer full: reported once, with EPOLLOUT.
c1, s1 = pairs[1]
sent = 0
while True:
    try:
        sent += s1.send(b"w" * 65536)
    except BlockingIOError:
        break
quiet(ep, "a full buffer and nothing new")
got = 0
while got < sent:
    got += len(c1.recv(1 << 20))
evs = ep.poll(5)
assert evs == [(s1.fileno(), OUT)], evs
quiet(ep, "room reported")

# One-shot: reported once, not again until re-armed, in a set whose other streams are
# answered in user space.
c4, s4 = pair(lst)
ep.register(s4.fileno(), IN | ONESHOT)
c4.sendall(b"one")
evs = ep.poll(5)
assert evs == [(s4.fileno(), IN)], evs
c4.sendall(b"two")
for k in range(20):
    pairs[k % len(pairs)][0].sendall(b"q")
    for fd, _ in ep.poll(0.01):
        assert fd != s4.fileno(), f"one-shot reported again before it was re-armed (call {k})"
        drain(pairs[by_fd[fd]][1])
ep.modify(s4.fileno(), IN | ONESHOT)
evs = []
for _ in range(10):
    evs = [e for e in ep.poll(0.2) if e[0] == s4.fileno()]
    if evs:
        break
assert evs == [(s4.fileno(), IN)], evs
assert drain(s4) == b"onetwo"
for _ in range(20):
    for fd, _ in ep.poll(0):
        assert fd != s4.fileno(), "one-shot reported again before it was re-armed"
        drain(pairs[by_fd[fd]][1])

# End of stream: EPOLLRDHUP with EPOLLIN (the kernel answers it).
c2, s2 = pairs[2]
c2.sendall(b"last")
c2.shutdown(socket.SHUT_WR)
for _ in range(10):
    evs = dict(ep.poll(5))
    for fd in evs:
        if fd in by_fd and fd != s2.fileno():
            drain(pairs[by_fd[fd]][1])
    if s2.fileno() in evs:
        break
assert evs.get(s2.fileno(), 0) & (IN | RDHUP) == IN | RDHUP, evs
assert s2.recv(100) == b"last"
assert s2.recv(100) == b"", "end of stream"
ep.unregister(s2.fileno())

ep.close()
for c, s in pairs + [(c4, s4)]:
    c.close()
    s.close()
os.close(rp)
os.close(wp)
lst.close()
print("OK", made(), "connections", flush=True)
