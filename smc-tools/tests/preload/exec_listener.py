"""A listener that goes on across exec (used by tests/preload.rs), as nginx's binary upgrade,
socket activation and inetd pass theirs.

Usage:
  exec_listener.py serve preloaded|plain|forked
      Listens on two ports of 127.0.0.1 and prints "PORT GONEPORT". The first listener is made
      inheritable, the second stays close-on-exec. Then it os.execv's "accept FD GONEFD" of this
      script (os.execve with an environment without LD_PRELOAD for "plain"; for "forked" a
      child does, and this process closes both listeners once the exec is done, then waits for
      the child: it held the socket last, and the new program's listener must go on).
  exec_listener.py accept FD GONEFD
      Prints "PRELOADED yes|no" on stderr. GONEFD must be gone, FD a listening TCP socket. It
      registers FD with epoll (selectors), prints "READY", accepts one connection, echoes it
      until end of stream and prints "ECHOED <bytes>" on stderr.
  exec_listener.py client PORT LEN
      Connects, sends LEN pattern bytes, shuts down its write side, reads the echo to its end,
      and prints "OK" if it is the bytes sent.
"""
import os
import selectors
import socket
import sys


def pattern(n):
    return bytes((i * 7 + i // 251) & 0xFF for i in range(n))


def serve(how):
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    gone.listen(8)
    os.set_inheritable(lsock.fileno(), True)
    print(lsock.getsockname()[1], gone.getsockname()[1], flush=True)
    args = [sys.executable, sys.argv[0], "accept", str(lsock.fileno()), str(gone.fileno())]
    if how == "forked":
        # A child execs the program; this process closes its listener once the exec is done
        # (end of file on a close-on-exec pipe), so it holds the socket last, then waits.
        rd, wr = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(rd)
            os.execv(sys.executable, args)
        os.close(wr)
        while os.read(rd, 1):
            pass
        lsock.close()
        gone.close()
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    if how == "plain":
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        os.execve(sys.executable, args, env)
    os.execv(sys.executable, args)


def accept(fd, gonefd):
    with open("/proc/self/maps") as m:
        loaded = "libsmc_preload" in m.read()
    sys.stderr.write(f"PRELOADED {'yes' if loaded else 'no'}\n")
    try:
        os.fstat(gonefd)
    except OSError:
        pass
    else:
        target = os.readlink(f"/proc/self/fd/{gonefd}")
        raise SystemExit(f"close-on-exec listener {gonefd} survived exec: {target}")
    lsock = socket.socket(fileno=fd)
    assert lsock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1, "not listening"
    # Blocking, as this program wants it: a socket other processes still held at the exec
    # ("forked") comes non-blocking (their engines need it; docs/smc-run.md).
    lsock.setblocking(True)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ)
    print("READY", flush=True)
    sel.select()
    c, _ = lsock.accept()
    total = 0
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
        total += len(b)
    c.shutdown(socket.SHUT_WR)
    c.close()
    sys.stderr.write(f"ECHOED {total}\n")


def client(port, n):
    data = pattern(n)
    s = socket.create_connection(("127.0.0.1", port))
    got = bytearray()

    sel = selectors.DefaultSelector()
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
    view = memoryview(data)
    done_writing = False
    while True:
        for key, ev in sel.select():
            if ev & selectors.EVENT_WRITE and not done_writing:
                try:
                    view = view[s.send(view[:65536]):]
                except BlockingIOError:
                    pass
                if not view:
                    s.shutdown(socket.SHUT_WR)
                    done_writing = True
                    sel.modify(s, selectors.EVENT_READ)
            if ev & selectors.EVENT_READ:
                try:
                    b = s.recv(65536)
                except BlockingIOError:
                    continue
                if not b:
                    assert done_writing, "end of stream before everything was sent"
                    print("OK" if got == data else f"DIFFERENT {len(got)} of {n}", flush=True)
                    return
                got += b


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif sys.argv[1] == "accept":
        accept(int(sys.argv[2]), int(sys.argv[3]))
    else:
        client(int(sys.argv[2]), int(sys.argv[3]))
