"""A non-blocking connect still under way when the program forks (used by tests/preload.rs).

Usage: fork_connect.py PORT child|parent LEN
connect() on a non-blocking socket says EINPROGRESS and the socket is not writable yet (the
server has not answered); the program forks and prints "FORKED". The process named by the
second argument (the "finisher") waits for the socket to become writable, reads SO_ERROR (0),
sends LEN pattern bytes and reads them back (the server echoes), byte for byte, and prints
"OK LEN"; the other process closes its copy of the socket at once. The parent then waits for
the child and exits with its status (1 if the parent itself failed).
"""
import errno
import os
import select
import socket
import sys

port, who, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
s = socket.socket()
s.setblocking(False)
r = s.connect_ex(("127.0.0.1", port))
assert r == errno.EINPROGRESS, f"connect: {errno.errorcode.get(r, r)}"
p = select.poll()
p.register(s.fileno(), select.POLLOUT)
assert not p.poll(0), "the connect finished before the server answered"
pid = os.fork()
is_child = pid == 0
finisher = is_child if who == "child" else not is_child
if not is_child:
    print("FORKED", flush=True)


def pattern(i):
    return bytes((k * 7 + 3) % 251 for k in range(i, i + 4096))


def finish():
    if is_child:
        # A poll made in the finisher after the fork, on an epoll set of its own.
        ep = select.epoll()
        ep.register(s.fileno(), select.EPOLLOUT)
        ev = ep.poll(60)
        assert ev and ev[0][1] & select.EPOLLOUT, f"epoll: {ev}"
    else:
        q = select.poll()
        q.register(s.fileno(), select.POLLOUT)
        ev = q.poll(60000)
        assert ev and ev[0][1] & select.POLLOUT, f"poll: {ev}"
    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    assert err == 0, f"SO_ERROR {err}"
    s.setblocking(True)
    s.settimeout(60)
    want = b"".join(pattern(i) for i in range(0, n, 4096))[:n]
    s.sendall(want)
    got = bytearray()
    while len(got) < n:
        d = s.recv(65536)
        assert d, f"end of stream after {len(got)} bytes"
        got += d
    assert bytes(got) == want, "echo differs"
    s.close()
    print(f"OK {n}", flush=True)


try:
    if finisher:
        finish()
    else:
        s.close()
except Exception as e:  # noqa: BLE001 - reported to the test
    print(f"FAIL {'child' if is_child else 'parent'}: {e!r}", flush=True)
    os._exit(1)
if is_child:
    os._exit(0)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
