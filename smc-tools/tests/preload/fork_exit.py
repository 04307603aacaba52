"""A connection inherited by forked children that end without closing it (os._exit, as a
forked worker or a failed exec leaves): the connection must still end for the peer.

1. The child exits first; the parent then writes and closes: the peer reads the bytes and
   end of stream (with the library before, the parent's close counted the dead child as a
   holder and ended nothing: the peer waited for ever).
2. The parent writes, closes its copy first, and the child exits afterwards, never having
   used it: the peer reads the bytes, then end of stream or a reset (the kernel's socket
   closes at the last holder's exit; the library's peer sees its TCP connection end, and an
   SMC connection whose last holder never closed it is aborted), never a hang.
Prints OK."""
import os
import socket
import sys
import time

import fork_deadline  # noqa: F401 (every process of the run ends within 100 s)

TIMEOUT = 20


def server(ls, expect):
    """Accept one connection, read `expect` bytes, acknowledge them, then read to the end."""
    c, _ = ls.accept()
    c.settimeout(TIMEOUT)
    data = b""
    while len(data) < len(expect):
        b = c.recv(65536)
        if not b:
            break
        data += b
    if data != expect:
        print("server: %d bytes, expected %d" % (len(data), len(expect)))
        os._exit(1)
    c.sendall(b"k")
    try:
        rest = c.recv(65536)
    except ConnectionResetError:
        rest = b""
    except TimeoutError:
        print("server: no end of the connection within %d s" % TIMEOUT)
        os._exit(1)
    os._exit(0 if rest == b"" else 1)


def run(child_first):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)
    msg = (b"child-first " if child_first else b"parent-first ") * 5000
    addr = ls.getsockname()
    srv = os.fork()
    if srv == 0:
        server(ls, msg)
    ls.close()
    s = socket.create_connection(addr, timeout=TIMEOUT)
    r, w = os.pipe()
    kid = os.fork()
    if kid == 0:
        os.close(w)
        os.read(r, 1)  # until the parent says (or closes its end)
        os._exit(0)
    os.close(r)
    if child_first:
        os.close(w)
        os.waitpid(kid, 0)
    s.sendall(msg)
    if s.recv(1) != b"k":
        print("no acknowledgement")
        sys.exit(1)
    s.close()
    if not child_first:
        time.sleep(0.2)
        os.close(w)
        os.waitpid(kid, 0)
    _, st = os.waitpid(srv, 0)
    if st != 0:
        print("server ended with", st, "child_first" if child_first else "parent_first")
        sys.exit(1)


run(child_first=True)
run(child_first=False)
print("OK")
