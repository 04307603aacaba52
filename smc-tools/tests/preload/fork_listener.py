"""A listening socket made before a fork and accepted from by a child only (a pre-fork server
whose master never accepts), once with the parent keeping its descriptor and once with the
parent closing it after the fork. Every client must be answered by a child, byte for byte.

With the library before this test, the parent's engine took connections off the kernel's
queue while its program was not in `accept` (on the SMC option path, to finish SMC clients'
connects as the kernel's listen work does), into a queue only the parent reads: 6 of 8 runs
hung. Prints OK."""
import os
import socket
import sys

import fork_deadline  # noqa: F401 (every process of the run ends within 100 s)

CLIENTS = 12
TIMEOUT = 20


def serve(ls, n):
    """Accept n connections, echo each connection's bytes reversed, then exit."""
    for _ in range(n):
        c, _ = ls.accept()
        c.settimeout(TIMEOUT)
        data = b""
        while not data.endswith(b"\n"):
            b = c.recv(65536)
            if not b:
                break
            data += b
        c.sendall(data[::-1])
        c.close()
    os._exit(0)


def run(parent_closes):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    port = ls.getsockname()[1]
    kids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            serve(ls, CLIENTS // 2)
        kids.append(pid)
    if parent_closes:
        ls.close()
    for i in range(CLIENTS):
        msg = (b"%d-" % i) * (100 + 997 * i) + b"\n"
        s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        s.sendall(msg)
        got = b""
        while len(got) < len(msg):
            b = s.recv(65536)
            if not b:
                break
            got += b
        s.close()
        if got != msg[::-1]:
            print("client %d: %d bytes back, %d sent" % (i, len(got), len(msg)))
            sys.exit(1)
    for pid in kids:
        _, st = os.waitpid(pid, 0)
        if st != 0:
            print("server child ended with", st)
            sys.exit(1)
    if not parent_closes:
        ls.close()


run(parent_closes=False)
run(parent_closes=True)
print("OK")
