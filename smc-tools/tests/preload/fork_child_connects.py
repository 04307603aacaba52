"""A forked child makes a non-blocking connect of its own after its parent made one (a
pre-fork worker connecting to a backend). The child's connect must finish: with the library
before, the child used its copy of the parent's connector, whose thread is not in the child
and whose epoll instance it shares with the parent, and the connect timed out. The same for
the liveness watcher: a forked child's connection whose peer went away without an SMC close
must end there, not wait for ever. Prints OK."""
import os
import socket
import sys
import threading
import time

import fork_deadline  # noqa: F401 (every process of the run ends within 100 s)

ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
addr = ls.getsockname()
s = socket.create_connection(addr, timeout=10)
c, _ = ls.accept()
s.sendall(b"x")
assert c.recv(1) == b"x"

kid = os.fork()
if kid == 0:
    got = []
    th = threading.Thread(target=lambda: got.append(ls.accept()[0]))
    th.start()
    try:
        s2 = socket.create_connection(addr, timeout=10)
    except OSError as e:
        print("child: connect failed:", e)
        os._exit(1)
    th.join()
    s2.sendall(b"y")
    if got[0].recv(1) != b"y":
        os._exit(1)
    # The peer (a grandchild holding the other end) exits without closing: the watcher of
    # this process must see the TCP connection end.
    peer = got[0]
    g = os.fork()
    if g == 0:
        os._exit(0)
    peer.close()
    os.waitpid(g, 0)
    s2.settimeout(10)
    try:
        end = s2.recv(10)
    except ConnectionResetError:
        end = b""
    except TimeoutError:
        print("child: no end of the connection")
        os._exit(1)
    os._exit(0 if end == b"" else 1)
_, st = os.waitpid(kid, 0)
if st != 0:
    print("child ended with", st)
    sys.exit(1)
print("OK")
