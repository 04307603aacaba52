"""A connection used by a parent and its forked child, one after the other and at the same
time, as a TCP socket can be: every byte arrives once, in each writer's order, and each read
takes bytes no other read took.

With the library before, each process moved its own copy of the connection's cursors: a
parent that sent 10 bytes, a child 5 and then the parent 6 made the peer read the child's 5
overwritten by the parent's. Prints OK."""
import os
import socket
import sys

import fork_deadline  # noqa: F401 (every process of the run ends within 100 s)
from streams import recv_exact

REC = 64
N = 2000
TIMEOUT = 30


def read_all(fd):
    """What a pipe carries until its writers closed it."""
    out = b""
    while True:
        b = os.read(fd, 65536)
        if not b:
            return out
        out += b


def pattern(tag, n):
    return bytes((tag + i) % 251 for i in range(n))


def server(ls):
    c, _ = ls.accept()
    c.settimeout(TIMEOUT)
    # 1. Writes one after the other: parent, child, parent.
    got = recv_exact(c, 10000 + 20000 + 5000)
    want = pattern(1, 10000) + pattern(2, 20000) + pattern(3, 5000)
    if got != want:
        first = next(i for i in range(len(want)) if got[i] != want[i])
        print("server: sequential writes differ at byte", first)
        os._exit(1)
    # 2. Writes at the same time: the parent's letters are small, the child's capital, and
    # each writer's arrive whole and in order (a send may be cut where the buffer was full,
    # as the kernel's SMC and TCP may cut it, so the two mix at any byte).
    got = recv_exact(c, 2 * N * REC)
    for letters, base in ((b"abcdefghijklmnopqrstuvwxyz", 97), (b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", 65)):
        mine = bytes(b for b in got if b in letters)
        if mine != letters_of(base, N * REC):
            print("server: %d bytes of the writer of %c, %d expected" % (len(mine), base, N * REC))
            os._exit(1)
    # 3. Reads one after the other and at the same time: the peer sends a numbered stream,
    # then its end.
    c.sendall(b"".join(b"%07d\n" % i for i in range(40000)))
    c.shutdown(socket.SHUT_WR)
    # 4. The end: both let go (the child by exiting, the parent by closing).
    if c.recv(100) != b"":
        print("server: bytes after the end")
        os._exit(1)
    os._exit(0)


def letters_of(base, n):
    return bytes(base + i % 26 for i in range(n))


ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(8)
addr = ls.getsockname()
srv = os.fork()
if srv == 0:
    server(ls)
ls.close()
s = socket.create_connection(addr, timeout=TIMEOUT)

s.sendall(pattern(1, 10000))
kid = os.fork()
if kid == 0:
    s.sendall(pattern(2, 20000))
    os._exit(0)
os.waitpid(kid, 0)
s.sendall(pattern(3, 5000))

r, w = os.pipe()
kid = os.fork()
if kid == 0:
    os.close(r)
    data = letters_of(65, N * REC)
    for i in range(N):
        s.sendall(data[i * REC : (i + 1) * REC])
    os.write(w, b"x")
    os._exit(0)
os.close(w)
data = letters_of(97, N * REC)
for i in range(N):
    s.sendall(data[i * REC : (i + 1) * REC])
if os.read(r, 1) != b"x":
    print("the writing child failed")
    sys.exit(1)
os.waitpid(kid, 0)

# Reads one after the other: the parent takes lines 0..9999, the child the next 10000.
first = recv_exact(s, 8 * 10000)
r, w = os.pipe()
kid = os.fork()
if kid == 0:
    os.close(r)
    os.write(w, recv_exact(s, 8 * 10000))
    os._exit(0)
os.close(w)
second = read_all(r)
os.close(r)
os.waitpid(kid, 0)
if first + second != b"".join(b"%07d\n" % i for i in range(20000)):
    print("sequential reads: wrong lines")
    sys.exit(1)

# Reads at the same time, until the server's end of stream: each process's pieces are
# contiguous runs of the stream, found by the first whole line in them; together they are
# the rest of the stream, every byte once.
STREAM = b"".join(b"%07d\n" % i for i in range(20000, 40000))
r, w = os.pipe()
kid = os.fork()


def read_pieces():
    pieces = []
    while True:
        b = s.recv(3000)
        if not b:
            return pieces
        pieces.append(b)


if kid == 0:
    os.close(r)
    for piece in read_pieces():
        os.write(w, b"%d\n" % len(piece) + piece)
    os._exit(0)
os.close(w)
pieces = read_pieces()
theirs = read_all(r)
os.waitpid(kid, 0)
while theirs:
    n, _, theirs = theirs.partition(b"\n")
    pieces.append(theirs[: int(n)])
    theirs = theirs[int(n):]
if sum(map(len, pieces)) != len(STREAM):
    print("concurrent reads: %d bytes of %d" % (sum(map(len, pieces)), len(STREAM)))
    sys.exit(1)
placed = []
loose = 0
for piece in pieces:
    nl = piece.find(b"\n")
    if nl < 0 or len(piece) < nl + 9:
        loose += len(piece)
        continue
    at = (int(piece[nl + 1 : nl + 8]) - 20000) * 8 - (nl + 1)
    if STREAM[at : at + len(piece)] != piece:
        print("concurrent reads: a piece that is not the stream at", at)
        sys.exit(1)
    placed.append((at, at + len(piece)))
placed.sort()
gaps = placed[0][0] + (len(STREAM) - placed[-1][1])
for (a0, a1), (b0, b1) in zip(placed, placed[1:]):
    if b0 < a1:
        print("concurrent reads: bytes read twice at", b0)
        sys.exit(1)
    gaps += b0 - a1
if gaps != loose:
    print("concurrent reads: %d bytes unaccounted for" % (gaps - loose))
    sys.exit(1)
s.close()
_, st = os.waitpid(srv, 0)
if st != 0:
    print("server ended with", st)
    sys.exit(1)
print("OK")
