"""An inetd-like server (used by tests/preload.rs).

Usage: exec_server.py PROGRAM preloaded|plain
Listens on 127.0.0.1 (prints the port) and accepts two connections. The first becomes stdin
and stdout (os.dup2 makes them inheritable); the second, like every socket Python makes, is
close-on-exec. An exec of a program that does not exist fails first (ENOENT), after which the
first connection still works here: it says "still here\n" on it. Then it os.execv's python3
PROGRAM with the numbers of the descriptors that are close-on-exec (both connections' own and
the listener's): with os.execv (the environment, LD_PRELOAD included, goes on) for "preloaded",
with os.execve and an environment without LD_PRELOAD for "plain".
"""
import os
import socket
import sys

lsock = socket.socket()
lsock.bind(("127.0.0.1", 0))
lsock.listen(4)
print(lsock.getsockname()[1], flush=True)
c, _ = lsock.accept()
d, _ = lsock.accept()
os.dup2(c.fileno(), 0)
os.dup2(c.fileno(), 1)
try:
    os.execv("/nonexistent/program", ["program"])
except FileNotFoundError:
    pass
c.sendall(b"still here\n")
gone = [str(x.fileno()) for x in (c, d, lsock)]
args = [sys.executable, sys.argv[1], *gone]
if sys.argv[2] == "plain":
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    os.execve(sys.executable, args, env)
os.execv(sys.executable, args)
