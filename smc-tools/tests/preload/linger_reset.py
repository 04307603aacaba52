"""SO_LINGER {1, 0} makes close an abort (used by tests/preload.rs, run under smc-run).

Both ends in this process, over SMC-D. An ordinary close: the peer reads the bytes, then end of
stream. A close with SO_LINGER {1, 0} (read back as set): the peer's next read fails with
ECONNRESET, as after TCP's reset. Prints "OK" at the end.
"""
import socket
import struct

ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(4)
addr = ls.getsockname()

c = socket.create_connection(addr)
s, _ = ls.accept()
c.sendall(b"bye")
c.close()
got = b""
while True:
    b = s.recv(16)
    if not b:
        break
    got += b
assert got == b"bye", got
s.close()

c = socket.create_connection(addr)
s, _ = ls.accept()
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
onoff, linger = struct.unpack("ii", c.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8))
assert (onoff, linger) == (1, 0), (onoff, linger)
c.close()
try:
    r = s.recv(16)
except ConnectionResetError:
    pass
else:
    raise SystemExit(f"read after the peer's abortive close: {r!r}")
s.close()
print("OK", flush=True)
