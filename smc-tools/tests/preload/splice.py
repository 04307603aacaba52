"""splice(2) between an SMC stream and a pipe (smc-preload's hook), through os.splice, which
calls the C library's splice (the preloaded symbol comes first). Checks what the kernel does
for a TCP socket: bytes move both ways in order; a pipe that is full or takes only part of
them leaves the rest in the stream; a non-blocking stream with no room leaves the bytes in
the pipe (EAGAIN); the end of stream is 0; an offset on the socket is EINVAL, on the pipe
ESPIPE; two sockets are EINVAL. Run under smc-run with smcd up; the last line is "OK 1 connections"."""
import errno
import fcntl
import os
import socket

from streams import recv_exact

F_SETPIPE_SZ = 1031
SPLICE_F_NONBLOCK = 2

lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.bind(("127.0.0.1", 0))
lst.listen(4)
c = socket.create_connection(lst.getsockname())
s, _ = lst.accept()


def pipe_small():
    """A pipe of one page."""
    r, w = os.pipe()
    fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
    return r, w


# Stream -> pipe: the bytes the stream has, at most what was asked.
c.sendall(b"hello, splice")
r, w = os.pipe()
n = os.splice(s.fileno(), w, 5)
assert n == 5 and os.read(r, 100) == b"hello", n
n = os.splice(s.fileno(), w, 100)
assert n == 8 and os.read(r, 100) == b", splice", n

# A pipe with room for part of it: what it took came out of the stream, the rest stays; a
# full pipe and SPLICE_F_NONBLOCK: EAGAIN, nothing taken.
data = bytes(range(256)) * 40  # 10,240 bytes
c.sendall(data)
assert len(s.recv(len(data), socket.MSG_PEEK | socket.MSG_WAITALL)) == len(data)
r2, w2 = pipe_small()
n = os.splice(s.fileno(), w2, len(data), flags=SPLICE_F_NONBLOCK)
assert 0 < n <= 4096, n
try:
    os.splice(s.fileno(), w2, len(data), flags=SPLICE_F_NONBLOCK)
    raise AssertionError("splice into a full pipe did not fail")
except BlockingIOError:
    pass
got = os.read(r2, 65536)
assert len(got) == n, (len(got), n)
got += recv_exact(s, len(data) - n)
assert got == data, (len(got), got[:16])

# A full pipe and SPLICE_F_NONBLOCK: EAGAIN, nothing taken from the stream.
os.write(w2, b"x" * 4096)
c.sendall(b"still here")
while s.recv(10, socket.MSG_PEEK) != b"still here":
    pass
try:
    os.splice(s.fileno(), w2, 10, flags=SPLICE_F_NONBLOCK)
    raise AssertionError("splice into a full pipe did not fail")
except BlockingIOError:
    pass
assert os.read(r2, 8192) == b"x" * 4096
assert s.recv(100) == b"still here"

# Pipe -> stream.
os.write(w, b"from a pipe")
n = os.splice(r, c.fileno(), 100)
assert n == 11, n
assert recv_exact(s, 11) == b"from a pipe"

# A non-blocking stream with no room: EAGAIN, and the pipe keeps the bytes.
c.setblocking(False)
sent = 0
try:
    while True:
        sent += c.send(b"f" * 65536)
except BlockingIOError:
    pass
os.write(w, b"wait for me")
try:
    os.splice(r, c.fileno(), 100)
    raise AssertionError("splice into a full stream did not fail")
except BlockingIOError:
    pass
assert os.read(r, 100) == b"wait for me"
assert recv_exact(s, sent) == b"f" * sent
c.setblocking(True)

# An offset on the socket side: EINVAL; on the pipe's: ESPIPE. Two sockets: EINVAL.
c.sendall(b"z")
for want, call in (
    (errno.EINVAL, lambda: os.splice(s.fileno(), w, 1, offset_src=0)),
    (errno.ESPIPE, lambda: os.splice(s.fileno(), w, 1, offset_dst=0)),
    (errno.EINVAL, lambda: os.splice(s.fileno(), c.fileno(), 1)),
):
    try:
        call()
        raise AssertionError("no error")
    except OSError as e:
        assert e.errno == want, (e, want)
assert s.recv(1) == b"z"

# The end of stream: 0.
c.shutdown(socket.SHUT_WR)
assert os.splice(s.fileno(), w, 100) == 0

s.close()
c.close()
print("OK 1 connections", flush=True)
