"""A client that reads its answer, closes and exits at once (curl, redis-cli): the server
must read the end of the stream, as with TCP. With the library before, a read that emptied
the ring listed the connection for the next wait's settle, the list kept it alive past the
close, the program exited without waiting again, and the server read ECONNRESET (its engine
saw the TCP connection end under an SMC connection nobody closed). Also with the client
sleeping after its close (nothing ended it then either). Prints OK."""
import os
import socket
import sys
import time

import fork_deadline  # noqa: F401 (every process of the run ends within 100 s)


def server(ls, rounds):
    for _ in range(rounds):
        c, _ = ls.accept()
        c.settimeout(20)
        req = c.recv(100)
        c.sendall(b"answer to " + req)
        try:
            rest = c.recv(100)
        except ConnectionResetError:
            print("server: reset after", req)
            os._exit(1)
        if rest != b"":
            print("server: unexpected", rest)
            os._exit(1)
        c.close()
    os._exit(0)


ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
addr = ls.getsockname()
srv = os.fork()
if srv == 0:
    server(ls, 4)
ls.close()
for i, linger in enumerate([False, True, False, True]):
    kid = os.fork()
    if kid == 0:
        s = socket.create_connection(addr, timeout=20) if i % 2 else socket.create_connection(addr)
        s.sendall(b"request %d" % i)
        got = s.recv(100)
        s.close()
        if linger:
            time.sleep(0.5)
        os._exit(0 if got == b"answer to request %d" % i else 1)
    _, st = os.waitpid(kid, 0)
    if st != 0:
        print("client", i, "ended with", st)
        sys.exit(1)
_, st = os.waitpid(srv, 0)
if st != 0:
    sys.exit(1)
print("OK")
