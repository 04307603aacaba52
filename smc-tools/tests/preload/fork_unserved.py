"""A listener that was forked and that no process accepts from for longer than a client's CLC
wait (6 s): the parent listens, forks a child that connects and sends, and accepts only 8 s
later. Over TCP the child's connect finishes at once and its bytes wait in the queue. With the
library before, the child's connect failed with ETIMEDOUT (its Proposal waited for an accept)
and the parent's accept then waited for ever. Now a holder that sees the kernel's queue
unserved declines the Proposal and hands the connection to whoever accepts: plain TCP, bytes
exact. Then the parent, accepting, serves a client of its own over SMC-D again. Prints OK."""
import os
import socket
import threading

import fork_deadline  # noqa: F401 (every process of the run ends within 100 s)
from streams import recv_exact

PATTERN = bytes(range(256)) * 256  # 64 KiB


ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
addr = ls.getsockname()

kid = os.fork()
if kid == 0:
    try:
        s = socket.create_connection(addr, timeout=30)
        s.sendall(PATTERN)
        ok = recv_exact(s, len(PATTERN)) == PATTERN
    except OSError as e:
        print("child:", e, flush=True)
        os._exit(1)
    os._exit(0 if ok else 2)

# Not accepting for longer than the client's CLC wait.
threading.Event().wait(8)
c, _ = ls.accept()
c.sendall(recv_exact(c, len(PATTERN)))
_, st = os.waitpid(kid, 0)
assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, "child failed: %r" % st
c.close()

# The parent accepts now: a client of its own is SMC-D again.
got = []
th = threading.Thread(target=lambda: got.append(ls.accept()[0]))
th.start()
s = socket.create_connection(addr, timeout=30)
th.join()
echo = threading.Thread(target=lambda: got[0].sendall(recv_exact(got[0], len(PATTERN))))
echo.start()
s.sendall(PATTERN)
assert recv_exact(s, len(PATTERN)) == PATTERN
echo.join()
s.close()
got[0].close()
print("OK")
