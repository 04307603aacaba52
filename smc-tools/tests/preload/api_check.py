"""The socket API over smc-run, both ends in this process (run under smc-run with smcd up).

Every check asserts; the last line printed is "OK <n> connections". Exercises what real
programs call (docs/smc-run.md): blocking and non-blocking I/O, MSG_PEEK / MSG_WAITALL /
MSG_DONTWAIT, readv/writev (sendmsg/recvmsg), sendfile, select/poll/epoll (level and edge
triggered), FIONREAD / FIONBIO, fcntl, dup, socket options and names, shutdown, close.
"""
import errno
import fcntl
import os
import select
import socket
import struct
import sys
import tempfile
import termios
import threading

N = 0


def pair(listener):
    global N
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.connect(listener.getsockname())
    s, peer = listener.accept()
    assert peer == c.getsockname(), (peer, c.getsockname())
    assert s.getpeername() == c.getsockname()
    assert c.getpeername() == listener.getsockname()
    N += 1
    return c, s


def pattern(n, seed=0):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


def recv_all(sock, n):
    out = bytearray()
    while len(out) < n:
        b = sock.recv(min(65536, n - len(out)))
        assert b, "early end of stream"
        out += b
    return bytes(out)


lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(("127.0.0.1", 0))
lst.listen(16)
assert lst.getsockname()[1] != 0

# Blocking round trips, large transfers both ways at once.
c, s = pair(lst)
data = pattern(3 * 1024 * 1024 + 17)
t = threading.Thread(target=lambda: c.sendall(data))
t.start()
got = recv_all(s, len(data))
t.join()
assert got == data, "bytes differ c->s"
t = threading.Thread(target=lambda: s.sendall(data[::-1]))
t.start()
assert recv_all(c, len(data)) == data[::-1], "bytes differ s->c"
t.join()

# MSG_PEEK leaves the bytes; MSG_WAITALL waits for all of them; FIONREAD counts them.
c.sendall(b"hello world")
while True:
    avail = struct.unpack("i", fcntl.ioctl(s, termios.FIONREAD, b"\0\0\0\0"))[0]
    if avail == 11:
        break
assert s.recv(5, socket.MSG_PEEK) == b"hello"
assert s.recv(64, socket.MSG_PEEK) == b"hello world"
assert s.recv(5) == b"hello"
c.sendall(b"12345")
assert s.recv(11, socket.MSG_WAITALL) == b" world12345"

# MSG_DONTWAIT on a blocking socket; non-blocking mode (FIONBIO via setblocking, fcntl).
try:
    s.recv(10, socket.MSG_DONTWAIT)
    raise AssertionError("MSG_DONTWAIT read did not fail")
except BlockingIOError as e:
    assert e.errno == errno.EAGAIN
s.setblocking(False)
assert fcntl.fcntl(s, fcntl.F_GETFL) & os.O_NONBLOCK
try:
    s.recv(10)
    raise AssertionError("non-blocking read did not fail")
except BlockingIOError:
    pass
s.setblocking(True)
assert not fcntl.fcntl(s, fcntl.F_GETFL) & os.O_NONBLOCK
fl = fcntl.fcntl(c, fcntl.F_GETFL)
fcntl.fcntl(c, fcntl.F_SETFL, fl | os.O_NONBLOCK)
sent = 0
chunk = b"x" * 65536
while True:
    try:
        sent += c.send(chunk)
    except BlockingIOError:
        break
assert sent > 0
# Writable again once the other side reads; poll says so.
p = select.poll()
p.register(c, select.POLLOUT)
assert p.poll(0) == [], "writable while the buffer is full"
assert recv_all(s, sent) == b"x" * sent
assert p.poll(5000) != [], "not writable after the reader drained"
fcntl.fcntl(c, fcntl.F_SETFL, fl)

# Vectors: writev/sendmsg in, readv/recvmsg out.
parts = [b"a" * 10, b"", b"b" * 70000, b"c" * 3]
res = []
t = threading.Thread(target=lambda: res.append(c.sendmsg(parts)))
t.start()
buf1, buf2 = bytearray(10), bytearray(70003)
n = 0
while n < 70013:
    n += s.recvmsg_into([memoryview(buf1)[n:] if n < 10 else memoryview(buf1)[10:], memoryview(buf2)[max(0, n - 10):]])[0]
t.join()
assert res == [70013], res
assert bytes(buf1) == b"a" * 10 and bytes(buf2) == b"b" * 70000 + b"c" * 3
os.writev(c.fileno(), [b"one", b"two"])
assert recv_all(s, 6) == b"onetwo"

# sendfile (os.sendfile under socket.sendfile), from an offset.
with tempfile.TemporaryFile() as f:
    f.write(data)
    f.flush()
    f.seek(0)
    t = threading.Thread(target=lambda: c.sendfile(f, 1000, 2 * 1024 * 1024))
    t.start()
    assert recv_all(s, 2 * 1024 * 1024) == data[1000:1000 + 2 * 1024 * 1024]
    t.join()

# select, poll and epoll (level and edge triggered) on the same connection.
r, _, _ = select.select([s], [], [], 0)
assert r == []
c.sendall(b"ping")
r, w, _ = select.select([s], [s], [], 5)
assert r == [s] and w == [s]
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN | select.EPOLLET | select.EPOLLRDHUP)
ev = ep.poll(5)
assert ev and ev[0][1] & select.EPOLLIN, ev
assert ep.poll(0) == [], "edge-triggered fired twice"
assert s.recv(4) == b"ping"
c.sendall(b"pong")
ev = ep.poll(5)
assert ev and ev[0][1] & select.EPOLLIN, ev
assert s.recv(4) == b"pong"

# A read that empties the connection leaves it not readable for select, poll and a level-
# triggered epoll (the library settles what a read left before any of them waits), and the
# next bytes make it readable again; a blocking read in between gets them.
lt = select.epoll()
lt.register(s.fileno(), select.EPOLLIN)
for i in range(20):
    msg = b"m%02d" % i
    c.sendall(msg)
    assert lt.poll(5) != [], f"round {i}: not readable with bytes waiting"
    assert s.recv(3) == msg
    assert select.select([s], [], [], 0)[0] == [], f"round {i}: select: readable after the read"
    q = select.poll()
    q.register(s, select.POLLIN)
    assert q.poll(0) == [], f"round {i}: poll: readable after the read"
    assert lt.poll(0) == [], f"round {i}: epoll: readable after the read"
c.sendall(b"blk")
assert s.recv(3) == b"blk"
c.sendall(b"blk2")
assert select.select([s], [], [], 5)[0] == [s]
assert s.recv(4) == b"blk2"
lt.close()

# dup: both numbers are the connection; closing one leaves the other.
d = os.dup(s.fileno())
c.sendall(b"dup")
assert os.read(d, 3) == b"dup"
os.close(d)
c.sendall(b"after")
assert s.recv(5) == b"after"

# Options: TCP_NODELAY and timeouts read back; SO_TYPE and SO_ERROR.
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
assert c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
assert c.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM
assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
s.settimeout(0.2)
try:
    s.recv(1)
    raise AssertionError("timeout did not fire")
except socket.timeout:
    pass
s.settimeout(None)

# shutdown(SHUT_WR): the other side reads the end of stream (and EPOLLRDHUP), can still send.
c.shutdown(socket.SHUT_WR)
assert s.recv(10) == b""
ev = ep.poll(5)
assert ev and ev[0][1] & select.EPOLLRDHUP, ev
s.sendall(b"still")
assert recv_all(c, 5) == b"still"
ep.close()
s.close()
# The peer's close: end of stream; then writing fails with EPIPE (no SIGPIPE: Python
# ignores it) or ECONNRESET.
assert c.recv(10) == b""
c.close()

# Non-blocking connect (the handshake is done when connect returns) and accept on a
# non-blocking listener, as event loops do.
lst.setblocking(False)
try:
    lst.accept()
    raise AssertionError("non-blocking accept did not fail")
except BlockingIOError:
    pass
# (The connect runs on another thread: it returns once the handshake is done, which the
# non-blocking listener's accept drives.)
c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
c.setblocking(False)
res = []
t = threading.Thread(target=lambda: res.append(c.connect_ex(lst.getsockname())))
t.start()
s = None
while s is None:
    select.select([lst], [], [], 5)
    try:
        s, _ = lst.accept()
    except BlockingIOError:
        pass
N += 1
t.join()
assert res[0] in (0, errno.EINPROGRESS), res
select.select([], [c], [], 5)
assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
c.setblocking(True)
s.setblocking(True)
c.sendall(b"nb")
assert recv_all(s, 2) == b"nb"
c.close()
s.close()

# A socket duplicated before connect is still an SMC candidate (the copy connects).
orig = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.setblocking(True)
c = socket.socket(fileno=os.dup(orig.fileno()))
orig.close()
t = threading.Thread(target=lambda: c.connect(lst.getsockname()))
t.start()
s, _ = lst.accept()
t.join()
N += 1
c.sendall(b"dup before connect")
assert recv_all(s, 18) == b"dup before connect"
c.close()
s.close()
lst.close()
print("OK", N, "connections", flush=True)
