"""Imported by the fork test scripts: every process of a run ends within 100 s (SIGALRM), so a
run that fails leaves no server children behind (the harness kills the script it started,
not its children). Not done with socket timeouts: a timeout makes a listener non-blocking,
which changes the path fork_listener.py tests (the engine leaves a driven listener's queue
alone)."""
import os
import signal

LIMIT = 100
_fork = os.fork


def _fork_with_alarm():
    pid = _fork()
    if pid == 0:
        signal.alarm(LIMIT)
    return pid


signal.alarm(LIMIT)
os.fork = _fork_with_alarm
