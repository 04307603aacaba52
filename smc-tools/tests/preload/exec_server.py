"""An inetd-like server (used by tests/preload.rs).

Usage: exec_server.py PROGRAM preloaded|plain|execl|execle|execlp|closeloop
Listens on 127.0.0.1 (prints the port) and accepts two connections (printing "ACCEPTED"
after the first). The first becomes stdin
and stdout (os.dup2 makes them inheritable); the second, like every socket Python makes, is
close-on-exec. An exec of a program that does not exist fails first (ENOENT), after which the
first connection still works here: it says "still here\n" on it. Then it os.execv's python3
PROGRAM with the numbers of the descriptors that are close-on-exec (both connections' own and
the listener's): with os.execv (the environment, LD_PRELOAD included, goes on) for "preloaded",
with os.execve and an environment without LD_PRELOAD for "plain"; with the C library's
variadic execl, execlp (found through PATH) or execle (an environment without LD_PRELOAD),
called through ctypes, for those. With "closeloop" it first closes every number from 3 up to
its descriptor limit one os.close at a time, as a daemon or an inetd child does (the limit as
resource.getrlimit and os.sysconf("SC_OPEN_MAX") say, which must agree, lowered by 8 with
resource.setrlimit first), then os.execv's.
"""
import os
import socket
import sys

lsock = socket.socket()
lsock.bind(("127.0.0.1", 0))
lsock.listen(4)
print(lsock.getsockname()[1], flush=True)
c, _ = lsock.accept()
# The client connects the second only now: connections that race are accepted in the order
# their handshakes end, not the order they began.
print("ACCEPTED", flush=True)
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
how = sys.argv[2]
if how in ("execl", "execle", "execlp"):
    # The C library's variadic forms, called as a C program would (through ctypes).
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    cargs = [a.encode() for a in args] + [None]
    if how == "execl":
        getattr(libc, how)(sys.executable.encode(), *cargs)
    elif how == "execlp":
        # Found through PATH.
        os.environ["PATH"] = os.path.dirname(sys.executable) + ":" + os.environ.get("PATH", "")
        libc.execlp(os.path.basename(sys.executable).encode(), *cargs)
    else:
        env = [f"{k}={v}".encode() for k, v in os.environ.items() if k != "LD_PRELOAD"]
        envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
        libc.execle(sys.executable.encode(), *cargs, envp)
    raise SystemExit(f"{how} failed: {os.strerror(ctypes.get_errno())}")
if how == "closeloop":
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == os.sysconf("SC_OPEN_MAX"), (soft, os.sysconf("SC_OPEN_MAX"))
    # A limit the program sets itself is the one it reads back (the library keeps the real
    # one where its band still fits).
    soft -= 8
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft
    assert os.sysconf("SC_OPEN_MAX") == soft
    for fd in range(3, soft):
        try:
            os.close(fd)
        except OSError:
            pass
    os.execv(sys.executable, args)
if how == "plain":
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    os.execve(sys.executable, args, env)
os.execv(sys.executable, args)
