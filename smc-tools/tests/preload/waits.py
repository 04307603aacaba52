"""What epoll_withdraw.py and epoll_tagged.py share: whether a thread sleeps in a wait on
descriptors (/proc/PID/task/TID/syscall), and how many bytes wait in Unix sockets' receive
queues (the kernel's sock_diag, asked over netlink from this process: what `ss -x` shows as
Recv-Q, without running a program, which would fork and wait on its pipes)."""
import socket
import struct
import time

# x86-64 and aarch64 numbers of the waits a thread may sleep in here.
WAITS = {"7", "23", "232", "270", "271", "281", "441", "22", "72", "73"}


def asleep(pid, tid, within=10.0):
    """Waits until thread `tid` of process `pid` is blocked in a wait on descriptors."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            if f.read().split(" ", 1)[0] in WAITS:
                return
        time.sleep(0.005)
    raise AssertionError(f"{pid}/{tid} did not go to sleep in a wait")


def queued(inodes):
    """The bytes in the receive queue of the Unix socket with each inode."""
    out = []
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4)  # NETLINK_SOCK_DIAG
    try:
        for ino in inodes:
            # unix_diag_req: AF_UNIX, protocol 0, all states, this inode, UDIAG_SHOW_RQLEN,
            # no cookie; in an nlmsghdr of SOCK_DIAG_BY_FAMILY (20), NLM_F_REQUEST.
            req = struct.pack("=BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, ino, 0x10,
                              0xFFFFFFFF, 0xFFFFFFFF)
            nl.send(struct.pack("=IHHII", 16 + len(req), 20, 1, ino, 0) + req)
            msg = nl.recv(65536)
            length, kind = struct.unpack_from("=IH", msg)
            assert kind != 2, f"sock_diag error for inode {ino}: {msg!r}"
            # unix_diag_msg (16 bytes), then attributes: UNIX_DIAG_RQLEN (4) is
            # (receive queue, send queue).
            at, rq = 32, None
            while at + 4 <= length:
                alen, atype = struct.unpack_from("=HH", msg, at)
                if atype == 4:
                    rq = struct.unpack_from("=I", msg, at + 4)[0]
                at += (alen + 3) & ~3
            assert rq is not None, f"no UNIX_DIAG_RQLEN for inode {ino}"
            out.append(rq)
    finally:
        nl.close()
    return out
