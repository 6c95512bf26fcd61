"""The suite's shared launches (tests/shared_launch.py, tests/rank_runner.py): each program's output and exit
code reach its own test only; a failing or hanging program fails its test with its output, and the programs
after it fail naming it; process-wide settings do not leak from one program into the next."""
import pytest

from tests.multirank import RANK_HELPERS, RanksTimedOut
from tests.shared_launch import Program, SharedLaunch


def _program(tmp_path, name, source, ranks=(2,), timeout=60.0, args=()):
    path = tmp_path / f"{name}.py"
    path.write_text(RANK_HELPERS + source)
    return Program(name, str(path), args=args, ranks=ranks, timeout=timeout)


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_each_program_gets_its_own_output_and_a_failure_ends_the_launch(tmp_path):
    launch = SharedLaunch([
        _program(tmp_path, "first", "import sys, os\nos.environ['LEAK'] = '1'\n"
                                    "print('first', rank_of_env(), sys.argv[1:])\n", args=("a", "b")),
        _program(tmp_path, "second", "import os, sys\nprint('second', rank_of_env(), os.environ.get('LEAK'))\n"
                                     "sys.exit(0)\n"),
        # rank 1 fails once rank 0 has ended "second" (these programs have no collective to keep the ranks
        # together; rank 0 would be stopped wherever it is)
        _program(tmp_path, "fails", f"import os, time\nprint('about to fail', flush=True)\n"
                                    f"mark = {str(tmp_path / 'rank-0-in-fails')!r}\n"
                                    f"if rank_of_env() == 0: open(mark, 'w').close()\n"
                                    f"deadline = time.time() + 60\n"
                                    f"while rank_of_env() == 1 and not os.path.exists(mark) and time.time() < deadline:\n"
                                    f"    time.sleep(0.05)\n"
                                    f"if rank_of_env() == 1: raise ValueError('planted')\n"),
        _program(tmp_path, "after", "print('never')\n"),
    ])
    first = launch.run("first", 2).check()
    assert first.rank_stdout == {0: "first 0 ['a', 'b']\n", 1: "first 1 ['a', 'b']\n"}, first.describe()
    second = launch.run("second", 2).check()
    assert second.rank_stdout == {0: "second 0 None\n", 1: "second 1 None\n"}, second.describe()  # env put back
    failed = launch.run("fails", 2)
    assert failed.returncode != 0 and "about to fail" in failed.rank_stdout[1]
    assert "ValueError: planted" in failed.rank_stderr[1], failed.describe()
    with pytest.raises(AssertionError, match=r"after did not (run|finish on every rank) at 2 ranks: the shared launch "
                                             r"ended in fails"):
        launch.run("after", 2)


@pytest.mark.multirank
@pytest.mark.timeout(120)
def test_a_hanging_program_times_out_alone_and_names_itself(tmp_path):
    launch = SharedLaunch([
        _program(tmp_path, "quick", "print('quick')\n"),
        _program(tmp_path, "hangs", "import time\nprint('hanging', flush=True)\ntime.sleep(600)\n", timeout=5),
        _program(tmp_path, "after", "print('never')\n"),
    ])
    assert launch.run("quick", 2).check().rank_stdout[0] == "quick\n"
    with pytest.raises(RanksTimedOut, match=r"(?s)hangs: 2 ranks did not finish within 5 s; killed.*hanging"):
        launch.run("hangs", 2)
    with pytest.raises(AssertionError, match="after did not run at 2 ranks: the shared launch ended in hangs"):
        launch.run("after", 2)
