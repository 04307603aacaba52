"""Options a program sets before connect are the connection's (used by tests/preload.rs), as
under the kernel's SMC, where a fallback is the very TCP socket the program made and an SMC
socket's TCP options are its clcsock's.

Usage: connect_options.py PLAINPORT
  PLAINPORT is a plain TCP server on 127.0.0.1 (not preloaded) that reads until end of stream.
  Sets SO_SNDBUF, SO_RCVBUF, SO_KEEPALIVE, IP_TOS and TCP_KEEPIDLE on a socket, connects it
  (blocking, then non-blocking) to PLAINPORT (a fallback) and to a listener of this process
  (SMC-D), and compares what getsockopt says on the connected socket with what it says on a
  configured socket that never connects. A socket bound to 127.0.0.2 without a port
  (IP_BIND_ADDRESS_NO_PORT) connects from that address, to the plain server and to the
  listener; one bound to a port connects from it. Then the buffer sizes set on a listener (SO_RCVBUF)
  and a client (SO_SNDBUF) size the SMC-D buffers: the client sends up to 256 KiB unread with
  them, at most smcd's 64 KiB without. Prints "OK" at the end.
"""
import select
import socket
import sys

OPTS = [
    (socket.SOL_SOCKET, socket.SO_SNDBUF, 98304),
    (socket.SOL_SOCKET, socket.SO_RCVBUF, 81920),
    (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
    (socket.IPPROTO_IP, socket.IP_TOS, 0x10),
    (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 77),
]


def configured():
    s = socket.socket()
    for level, name, value in OPTS:
        s.setsockopt(level, name, value)
    return s


def options(s):
    return [s.getsockopt(level, name) for level, name, _ in OPTS]


ref = configured()
want = options(ref)
ref.close()
assert want[2:] == [1, 0x10, 77], want


def check(what, s):
    got = options(s)
    assert got == want, f"{what}: options {got}, set before connect {want}"


plain = ("127.0.0.1", int(sys.argv[1]))

c = configured()
c.connect(plain)
check("fallback, blocking connect", c)
c.sendall(b"blocking")
c.close()

c = configured()
c.setblocking(False)
err = c.connect_ex(plain)
assert err in (0, 115), err  # EINPROGRESS
_, w, _ = select.select([], [c], [], 30)
assert w, "the non-blocking connect did not finish"
assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
check("fallback, non-blocking connect", c)
c.setblocking(True)
c.sendall(b"nonblocking")
c.close()

ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(4)
c = configured()
c.connect(ls.getsockname())
s, _ = ls.accept()
check("SMC-D", c)
c.sendall(b"smc")
assert s.recv(16) == b"smc"
for x in (c, s):
    x.close()


def bound_without_port():
    # IP_BIND_ADDRESS_NO_PORT (24): the address now, the port at connect (proxies do this).
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_IP, 24, 1)
    s.bind(("127.0.0.2", 0))
    return s


c = bound_without_port()
c.connect(plain)
assert c.getsockname()[0] == "127.0.0.2", c.getsockname()
c.close()
c = bound_without_port()
c.connect(ls.getsockname())
s, _ = ls.accept()
assert c.getsockname()[0] == "127.0.0.2", c.getsockname()
assert s.getpeername()[0] == "127.0.0.2", s.getpeername()
c.sendall(b"bound")
assert s.recv(16) == b"bound"
for x in (c, s):
    x.close()

# Bound to a port of its own before connect: the connection comes from that port (SMC-D).
c = socket.socket()
c.bind(("127.0.0.1", 0))
port = c.getsockname()[1]
c.connect(ls.getsockname())
s, _ = ls.accept()
assert c.getsockname()[1] == port and s.getpeername()[1] == port, (port, c.getsockname())
c.sendall(b"port")
assert s.recv(16) == b"port"
for x in (c, s, ls):
    x.close()


def unread_capacity(rcvbuf, sndbuf):
    """Bytes a client can send to a listener of this process that reads nothing, with the
    listener's SO_RCVBUF and the client's SO_SNDBUF set (None: not set) before listen/connect:
    the server's DMB and the client's send buffer bound it, as the kernel's SMC sizes its
    buffers by what setsockopt set."""
    ls = socket.socket()
    if rcvbuf:
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    ls.bind(("127.0.0.1", 0))
    ls.listen(4)
    c = socket.socket()
    if sndbuf:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    c.connect(ls.getsockname())
    s, _ = ls.accept()
    c.setblocking(False)
    sent = 0
    chunk = b"x" * 4096
    while True:
        try:
            sent += c.send(chunk)
        except BlockingIOError:
            break
    for x in (c, s, ls):
        x.close()
    return sent


# smcd's default wmem and rmem are 64 KiB: a client that asks for nothing sends at most that.
plain = unread_capacity(None, None)
assert plain <= 64 * 1024, plain
big = unread_capacity(256 * 1024, 256 * 1024)
assert 128 * 1024 < big <= 256 * 1024, f"with 256 KiB buffers set: {big} bytes (without: {plain})"
print("OK", flush=True)
