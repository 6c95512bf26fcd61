"""The ranks' side of a resize request (tarantella/elastic/committing.py: ResizeRequest), one process."""
import subprocess
import sys

import pytest

PROGRAM = """
import atexit, signal
atexit.register(lambda: print("at exit:", signal.getsignal(signal.SIGUSR1).name))   # runs last (LIFO)
from tarantella.elastic import committing
committing.resize_request()
print("in fit:", callable(signal.getsignal(signal.SIGUSR1)))
"""


@pytest.mark.timeout(60)
def test_a_request_as_the_program_ends_does_not_kill_it():
    """Python puts back SIGUSR1's default action (terminate) at exit for a handler it set: the launcher's request
    arriving then would kill a rank whose fit is done, and the launcher would count it lost."""
    done = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=50, check=True)
    assert done.stdout.split("\n")[:2] == ["in fit: True", "at exit: SIG_IGN"], done.stdout + done.stderr
