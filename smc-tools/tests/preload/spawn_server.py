"""A server that hands a connection to a program it starts with posix_spawn (used by
tests/preload.rs).

Usage: spawn_server.py PROGRAM dup2|inherit
Listens on 127.0.0.1 (prints the port on stdout) and accepts two connections, c and d
("ACCEPTED" on stdout after c), both close-on-exec, as every socket Python makes. It starts
python3 PROGRAM with c as the new program's stdin and stdout, passing the numbers of c, d and the listener (which must be gone
there):
  dup2:    os.posix_spawn with file actions that dup2 c to 0 and 1;
  inherit: os.dup2 of c to 0 and 1 here (not close-on-exec), then os.posix_spawnp.
The connection is still this process's too: it sends "parent here\\n" on it and reads one line,
which must be "for the parent\\n" (the program it started gets the connection, through a
keeper, only once this process no longer holds it: no byte this process reads goes there). Then it
closes every descriptor of c, says "PARENT CLOSED" on stderr, and exits with the program's
status.
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
gone = [str(x.fileno()) for x in (c, d, lsock)]
args = [sys.executable, sys.argv[1], *gone]
if sys.argv[2] == "dup2":
    actions = [
        (os.POSIX_SPAWN_DUP2, c.fileno(), 0),
        (os.POSIX_SPAWN_DUP2, c.fileno(), 1),
    ]
    pid = os.posix_spawn(sys.executable, args, os.environ, file_actions=actions)
else:
    sys.stdout.flush()
    os.dup2(c.fileno(), 0)
    os.dup2(c.fileno(), 1)
    # Found through PATH (this process's, as posix_spawnp searches it).
    os.environ["PATH"] = os.path.dirname(sys.executable) + ":" + os.environ.get("PATH", "")
    pid = os.posix_spawnp(os.path.basename(sys.executable), args, os.environ)
c.sendall(b"parent here\n")
line = b""
while not line.endswith(b"\n"):
    b = c.recv(1)
    if not b:
        raise SystemExit("end of stream before the parent's line")
    line += b
if line != b"for the parent\n":
    raise SystemExit(f"the parent read {line!r}")
c.close()
if sys.argv[2] == "inherit":
    os.close(0)
    os.close(1)
sys.stderr.write("PARENT CLOSED\n")
sys.stderr.flush()
_, status = os.waitpid(pid, 0)
d.close()
sys.exit(os.waitstatus_to_exitcode(status))
