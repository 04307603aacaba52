"""Imported by the test scripts: stream helpers they share."""


def recv_exact(s, n):
    """Exactly `n` bytes from socket `s`; end of stream before that raises EOFError."""
    out = b""
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            raise EOFError("end of stream after %d of %d bytes" % (len(out), n))
        out += b
    return out
