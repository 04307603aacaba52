"""subprocess under smc-run (used by tests/preload.rs): CPython's subprocess forks with vfork
(a fork while the process holds SMC descriptors: the library's vfork hook), and the child
closes descriptors (close_range), dup2s and execs through the library's hooks. Nothing of this
process's SMC connections or listener may change: a connection made before works after, and
the listener takes another. Then a connection given to the child (stdin and stdout, inetd
style) works there: cat echoes 1 MiB back byte for byte, and its end is the connection's.
Prints "OK" at the end.
"""
import os
import socket
import subprocess
import threading

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
for x in (c, s, c2, s2):
    x.close()

c3 = socket.create_connection(ls.getsockname())
s3, _ = ls.accept()
c3.sendall(b"before")
assert s3.recv(16) == b"before"
p = subprocess.Popen(["cat"], stdin=s3, stdout=s3)
s3.close()
data = os.urandom(1 << 20)
sender = threading.Thread(target=c3.sendall, args=(data,))
sender.start()
got = bytearray()
while len(got) < len(data):
    b = c3.recv(1 << 16)
    assert b, f"end of stream after {len(got)} of {len(data)} bytes"
    got += b
sender.join()
assert bytes(got) == data, "cat's echo differs"
c3.shutdown(socket.SHUT_WR)
assert c3.recv(16) == b"", "more than the echo came back"
assert p.wait(timeout=60) == 0, p.returncode
c3.close()
ls.close()
print("OK", flush=True)
