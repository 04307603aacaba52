"""closefrom(3) under smc-run (used by tests/preload.rs): a program that closes every
descriptor from 3 on (as daemons and programs about to exec do) closes its own SMC
connections and listener, and the library's own descriptors survive it: a listener and a
connection made afterwards work, byte for byte. Prints "OK" at the end.
"""
import ctypes
import socket
import threading


def pair(ls):
    c = socket.create_connection(ls.getsockname())
    s, _ = ls.accept()
    return c, s


ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(4)
c, s = pair(ls)
c.sendall(b"before")
assert s.recv(16) == b"before"
# Python must not close these numbers again after closefrom has.
for x in (c, s, ls):
    x.detach()
libc = ctypes.CDLL(None, use_errno=True)
libc.closefrom(3)

ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(4)
c, s = pair(ls)
data = bytes(range(256)) * 1024
sender = threading.Thread(target=c.sendall, args=(data,))
sender.start()
got = bytearray()
while len(got) < len(data):
    b = s.recv(65536)
    assert b, "end of stream"
    got += b
sender.join()
assert bytes(got) == data, "bytes differ after closefrom"
s.sendall(b"back")
assert c.recv(16) == b"back"
for x in (c, s, ls):
    x.close()
print("OK", flush=True)
