"""What epoll_user.py and epoll_edge.py share: connected pairs made in this process and a
drain. `made()` is how many pairs were made (the scripts print it: each is one SMC-D
connection under smc-run)."""
import socket

_made = 0


def pair(listener):
    """A client connected to `listener` and the server end, non-blocking."""
    global _made
    c = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    c.connect(listener.getsockname())
    s, _ = listener.accept()
    s.setblocking(False)
    _made += 1
    return c, s


def drain(s):
    """Reads what is there; a stream reported readable must have something."""
    got = b""
    while True:
        try:
            b = s.recv(65536)
        except BlockingIOError:
            return got
        assert b, "end of stream"
        got += b


def made():
    return _made
