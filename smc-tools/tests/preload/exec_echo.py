"""The program exec_server.py execs, as inetd runs a service (used by tests/preload.rs).

Usage: exec_echo.py FD...
Prints "PRELOADED yes|no" on stderr first (whether the library is loaded here).
The descriptors named (close-on-exec in the old program) must be gone; stdin must be a socket
(the connection the old program accepted). Echoes stdin to stdout until end of stream, then
prints "ECHOED <bytes>" on stderr.
"""
import os
import stat
import sys

with open("/proc/self/maps") as m:
    loaded = "libsmc_preload" in m.read()
sys.stderr.write(f"PRELOADED {'yes' if loaded else 'no'}\n")
for a in sys.argv[1:]:
    n = int(a)
    try:
        st = os.fstat(n)
    except OSError:
        continue
    target = os.readlink(f"/proc/self/fd/{n}")
    raise SystemExit(f"descriptor {n} survived exec: {target} mode {st.st_mode:o}")
assert stat.S_ISSOCK(os.fstat(0).st_mode), "stdin is not a socket"
total = 0
while True:
    b = os.read(0, 65536)
    if not b:
        break
    v = memoryview(b)
    while v:
        v = v[os.write(1, v):]
    total += len(b)
sys.stderr.write(f"ECHOED {total}\n")
