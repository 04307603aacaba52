"""A non-blocking connect as event loops make it (used by tests/preload.rs).

Usage: nb_connect.py PORT epoll|poll
connect() on a non-blocking socket must say EINPROGRESS; the program then waits for the
socket to become writable (registered with epoll, or in poll) while the connection is set up,
reads SO_ERROR (0), and exchanges "ping"/"pong". Prints "PONG <ms waited>".
"""
import errno
import select
import socket
import sys
import time

port, how = int(sys.argv[1]), sys.argv[2]
s = socket.socket()
s.setblocking(False)
r = s.connect_ex(("127.0.0.1", port))
assert r == errno.EINPROGRESS, f"connect: {errno.errorcode.get(r, r)}"
t = time.monotonic()
if how == "epoll":
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLOUT)
    ev = ep.poll(20)
    assert ev and ev[0][1] & select.EPOLLOUT, f"epoll: {ev}"
else:
    p = select.poll()
    p.register(s.fileno(), select.POLLOUT)
    ev = p.poll(20000)
    assert ev and ev[0][1] & select.POLLOUT, f"poll: {ev}"
waited = (time.monotonic() - t) * 1000
err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
assert err == 0, f"SO_ERROR {err}"
s.setblocking(True)
s.settimeout(20)
s.sendall(b"ping")
got = b""
while len(got) < 4:
    d = s.recv(4 - len(got))
    assert d, "end of stream"
    got += d
assert got == b"pong", got
print(f"PONG {waited:.0f}", flush=True)
