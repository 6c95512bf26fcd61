"""stop_process_group: SIGTERM to the whole group first, SIGKILL for a group that ignores it."""
import os
import signal
import subprocess
import sys
import time

from tarantella.launcher.process_group import stop_process_group

# A leader that starts a child in its group, writes the child's pid, then waits.
_LEADER = """
import os, signal, subprocess, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN) if %r == 'ignore' else None; time.sleep(60)" % sys.argv[1]])
print(child.pid, flush=True)
time.sleep(60)
"""


def _start(mode):
    process = subprocess.Popen([sys.executable, "-c", _LEADER, mode], stdout=subprocess.PIPE,
                               text=True, start_new_session=True)
    return process, int(process.stdout.readline())


def _gone(pid, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie child of the (dead) leader is reaped by init: look at its state
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().split(") ")[1].startswith("Z"):
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def test_a_group_that_obeys_sigterm_ends_without_sigkill():
    process, child = _start("obey")
    started = time.monotonic()
    stop_process_group(process, grace_seconds=20)
    assert process.returncode == -signal.SIGTERM
    assert time.monotonic() - started < 10
    assert _gone(child)


def test_a_group_that_ignores_sigterm_is_killed_after_the_grace_period():
    process, child = _start("ignore")
    started = time.monotonic()
    stop_process_group(process, grace_seconds=0.5)
    assert process.returncode == -signal.SIGKILL
    assert time.monotonic() - started >= 0.5
    assert _gone(child)


def test_a_group_that_already_ended_is_left_alone():
    process = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    process.wait()
    stop_process_group(process)
    assert process.returncode == 0
