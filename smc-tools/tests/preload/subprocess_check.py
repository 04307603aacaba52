"""subprocess under smc-run (used by tests/preload.rs): CPython's subprocess forks with vfork,
and the child closes descriptors (close_range), dup2s and execs through the library's hooks
while it runs in this process's memory. Nothing of this process's SMC connections or
listener may change: a connection made before works after, and the listener takes another.
Prints "OK" at the end.
"""
import socket
import subprocess

ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(4)
c = socket.create_connection(ls.getsockname())
s, _ = ls.accept()
c.sendall(b"one")
assert s.recv(16) == b"one"
out = subprocess.run(["echo", "child"], check=True, capture_output=True).stdout
assert out == b"child\n", out
c.sendall(b"two")
assert s.recv(16) == b"two"
s.sendall(b"back")
assert c.recv(16) == b"back"
c2 = socket.create_connection(ls.getsockname())
s2, _ = ls.accept()
c2.sendall(b"three")
assert s2.recv(16) == b"three"
for x in (c, s, c2, s2, ls):
    x.close()
print("OK", flush=True)
