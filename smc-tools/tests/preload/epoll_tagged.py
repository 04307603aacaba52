"""One ring per sleep (smc-preload: table::tag_sleep; smcd-engine: Dmb::take_ring): an event
loop asleep in epoll_wait on 8 connections, the only thread of its process waiting, is rung
once however many of its connections the peer writes to before it wakes; with a second thread
of its process waiting in the kernel, every connection is rung (nothing is tagged then, and
no wake-up can be lost). The loop is a child process stopped (SIGSTOP) while asleep, so the
writes all land during its sleep; its readiness sockets' receive queues are read through the
kernel's sock_diag (what `ss -x` shows as Recv-Q). Every arrival is still reported. Run under
smc-run with smcd up; the parent's last line is "OK <n> connections"."""
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

import fork_deadline  # noqa: F401 - every process of a run ends within 100 s
from waits import asleep, queued

N = 8


def stopped(pid, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.005)
    raise AssertionError(f"{pid} did not stop")


def child():
    port = int(sys.stdin.readline())
    conns = []
    for i in range(N):
        c = socket.create_connection(("127.0.0.1", port))
        # The parent's accept order need not be ours (handshakes finish in parallel): each
        # connection says which it is.
        c.sendall(bytes([i]))
        c.setblocking(False)
        conns.append(c)
    ep = select.epoll()
    for c in conns:
        ep.register(c.fileno(), select.EPOLLIN)
    by_fd = {c.fileno(): i for i, c in enumerate(conns)}
    print("FDS", " ".join(str(c.fileno()) for c in conns), flush=True)
    blocker = None
    for phase in (1, 2):
        assert sys.stdin.readline().strip() == f"PHASE{phase}"
        if phase == 2:
            # A second thread in a kernel wait: this process's sleeps are not tagged.
            rp, wp = os.pipe()
            blocker = threading.Thread(target=lambda: select.select([rp], [], [], 60))
            blocker.start()
            asleep(os.getpid(), blocker.native_id)
        print("SLEEPING", threading.get_native_id(), flush=True)
        got = {}
        while len(got) < N:
            for fd, ev in ep.poll(30):
                i = by_fd[fd]
                b = conns[i].recv(100)
                assert b, f"end of stream on {i}"
                got[i] = got.get(i, b"") + b
        want = {i: b"p%d-%d" % (phase, i) for i in range(N)}
        assert got == want, (got, want)
        print("GOT", phase, flush=True)
    os.write(wp, b"x")
    blocker.join()
    print("CHILD OK", flush=True)


def parent():
    p = subprocess.Popen([sys.executable, __file__, "child"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lst.bind(("127.0.0.1", 0))
    lst.listen(16)
    p.stdin.write(f"{lst.getsockname()[1]}\n")
    p.stdin.flush()
    ends = [None] * N
    for _ in range(N):
        a = lst.accept()[0]
        ends[a.recv(1)[0]] = a
    assert all(ends), ends
    fds = p.stdout.readline().split()
    assert fds[0] == "FDS", fds
    inodes = []
    for fd in fds[1:]:
        link = os.readlink(f"/proc/{p.pid}/fd/{fd}")
        assert link.startswith("socket:["), link
        inodes.append(int(link[8:-1]))
    for phase, rings in ((1, [1] + [0] * (N - 1)), (2, [1] * N)):
        p.stdin.write(f"PHASE{phase}\n")
        p.stdin.flush()
        line = p.stdout.readline().split()
        assert line[0] == "SLEEPING", line
        asleep(p.pid, int(line[1]))
        os.kill(p.pid, signal.SIGSTOP)
        stopped(p.pid)
        assert queued(inodes) == [0] * N, "rung before anything was written"
        for i, s in enumerate(ends):
            s.sendall(b"p%d-%d" % (phase, i))
        q = queued(inodes)
        assert q == rings, f"phase {phase}: receive queues {q}, wanted {rings}"
        os.kill(p.pid, signal.SIGCONT)
        line = p.stdout.readline().split()
        assert line == ["GOT", str(phase)], line
    assert p.stdout.readline().strip() == "CHILD OK"
    assert p.wait() == 0
    print(f"OK {N} connections", flush=True)


if len(sys.argv) > 1 and sys.argv[1] == "child":
    child()
else:
    parent()
