"""recvmmsg and sendmmsg on an SMC stream (smc-preload's hooks), called through the C library
as a C program calls them (ctypes: the preloaded symbols come first). Checks what the kernel
does for a TCP socket: sendmmsg sends every entry and says how much of each; recvmmsg fills
one entry per read, MSG_WAITFORONE makes the reads after the first non-blocking, the timeout
gets what is left of it, a non-blocking call with nothing to read is EAGAIN, and an entry that
finds the end of stream holds 0 bytes. And recv's MSG_TRUNC, which TCP takes as "discard". Run under smc-run with smcd up; the last line is
"OK 1 connections"."""
import ctypes
import errno
import socket

libc = ctypes.CDLL(None, use_errno=True)
MSG_DONTWAIT = 0x40
MSG_WAITFORONE = 0x10000


class Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class Msghdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(Iovec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class Mmsghdr(ctypes.Structure):
    _fields_ = [("msg_hdr", Msghdr), ("msg_len", ctypes.c_uint)]


class Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


libc.sendmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(Mmsghdr), ctypes.c_uint, ctypes.c_int]
libc.recvmmsg.argtypes = [ctypes.c_int, ctypes.POINTER(Mmsghdr), ctypes.c_uint, ctypes.c_int,
                          ctypes.POINTER(Timespec)]
keep = []


def entries(pieces_per_entry):
    """An mmsghdr array whose entries gather/scatter the given byte strings."""
    arr = (Mmsghdr * len(pieces_per_entry))()
    for i, pieces in enumerate(pieces_per_entry):
        iov = (Iovec * len(pieces))()
        for j, p in enumerate(pieces):
            buf = ctypes.create_string_buffer(p, len(p)) if p else None
            keep.append(buf)
            iov[j].iov_base = ctypes.addressof(buf) if buf else None
            iov[j].iov_len = len(p)
        keep.append(iov)
        arr[i].msg_hdr.msg_iov = iov
        arr[i].msg_hdr.msg_iovlen = len(pieces)
    return arr


def got(arr, i):
    """The bytes entry `i` received (its pieces in order, msg_len of them)."""
    h = arr[i].msg_hdr
    out = b""
    for j in range(h.msg_iovlen):
        out += ctypes.string_at(h.msg_iov[j].iov_base, h.msg_iov[j].iov_len)
    return out[: arr[i].msg_len]


def recvmmsg(fd, sizes, flags, timeout=None):
    arr = entries([[b"\0" * s] for s in sizes])
    n = libc.recvmmsg(fd, arr, len(sizes), flags, timeout)
    e = ctypes.get_errno()
    return n, e, arr


lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
lst.bind(("127.0.0.1", 0))
lst.listen(4)
c = socket.create_connection(lst.getsockname())
s, _ = lst.accept()

# sendmmsg: three entries, gathered from several pieces (one empty).
arr = entries([[b"ab", b"cd"], [b"efg"], [b"", b"hij"]])
n = libc.sendmmsg(c.fileno(), arr, 3, 0)
assert n == 3, (n, ctypes.get_errno())
assert [arr[i].msg_len for i in range(3)] == [4, 3, 3]
want = b"abcdefghij"
have = b""
while len(have) < len(want):
    have += s.recv(100)
assert have == want, have

# recvmmsg with MSG_WAITFORONE: the first read waits, the others take what is there.
c.sendall(b"0123456789")
n, e, arr = recvmmsg(s.fileno(), [4, 4, 4, 4], MSG_WAITFORONE)
assert n >= 1, (n, e)
parts = [got(arr, i) for i in range(n)]
assert b"".join(parts) == b"0123456789"[: sum(map(len, parts))], parts
rest = b"".join(parts)
while len(rest) < 10:
    rest += s.recv(100)
assert rest == b"0123456789", rest

# Non-blocking with nothing there: EAGAIN.
n, e, _ = recvmmsg(s.fileno(), [8, 8], MSG_DONTWAIT)
assert n == -1 and e == errno.EAGAIN, (n, e)

# MSG_WAITFORONE with less than the entries hold: one entry, then the call returns.
c.sendall(b"wxyz")
n, e, arr = recvmmsg(s.fileno(), [8, 8, 8], MSG_WAITFORONE)
assert (n, got(arr, 0)) == (1, b"wxyz"), (n, e, got(arr, 0))

# Blocking entries, each waits for its bytes; the timeout gets what is left of it.
c.sendall(b"12345678")
ts = Timespec(5, 0)
n, e, arr = recvmmsg(s.fileno(), [4, 4], 0, ctypes.byref(ts))
assert n == 2 and got(arr, 0) + got(arr, 1) == b"12345678", (n, e)
assert (ts.tv_sec, ts.tv_nsec) < (5, 0) and ts.tv_sec >= 0, (ts.tv_sec, ts.tv_nsec)

# TCP's MSG_TRUNC: the bytes are taken (with MSG_PEEK only counted) and not copied.
c.sendall(b"abcdefgh")
while s.recv(8, socket.MSG_PEEK) != b"abcdefgh":
    pass
assert len(s.recv(4, socket.MSG_TRUNC)) == 4
assert len(s.recv(2, socket.MSG_TRUNC | socket.MSG_PEEK)) == 2
assert s.recv(10) == b"efgh"

# The end of stream: an entry of 0 bytes.
c.sendall(b"last")
c.shutdown(socket.SHUT_WR)
n, e, arr = recvmmsg(s.fileno(), [4, 4], 0)
assert n == 2 and got(arr, 0) == b"last" and arr[1].msg_len == 0, (n, e)

# A plain socket (not ours) is passed through: a socketpair.
a, b = socket.socketpair()
arr = entries([[b"pair"]])
assert libc.sendmmsg(a.fileno(), arr, 1, 0) == 1
assert b.recv(10) == b"pair"

s.close()
c.close()
print("OK 1 connections", flush=True)
