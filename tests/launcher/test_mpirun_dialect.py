"""mpirun's and horovodrun's flags as users type them by habit (issue 22 §3): each means what it means
there, or is refused with one line saying what to write (the refusals are in test_cli.py's BAD)."""
from __future__ import annotations

import os

import pytest

from tests.multirank import RANK_HELPERS, run_ranks

from .dry_run import dry_run, exported, launcher_part, wrapper_part
from .test_pinning import NODES


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return str(path)


def _ranks(command):
    part = launcher_part(command)
    return part[part.index("-n") + 1]


def test_np_and_n_per_node_as_in_mpirun(capsys, script, tmp_path):
    assert _ranks(dry_run(capsys, ["-np", "3", script])) == "3"
    assert _ranks(dry_run(capsys, ["-N", "2", script])) == "2"   # one host: n = ranks per node
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=4\nb slots=4\n")
    command = launcher_part(dry_run(capsys, ["--hostfile", str(hosts), "-N", "2", script]))
    assert command[command.index("-n") + 1] == "4" and "a:2,b:2" in command


def test_hosts_with_and_without_counts(capsys, script):
    assert "a:1,b:1" in launcher_part(dry_run(capsys, ["-H", "a,b", script]))
    assert "a:2,b:2" in launcher_part(dry_run(capsys, ["-H", "a:2,b:2", script]))


def test_bind_to_socket_pins_and_none_does_not(capsys, script):
    pinned = wrapper_part(dry_run(capsys, ["-n", "2", "--bind-to", "socket", script], probe_numa=lambda: NODES))
    assert pinned[:2] == ["--local-rank-prefix", "numactl --cpunodebind=0 --preferred=0"]
    assert "--local-rank-prefix" not in wrapper_part(dry_run(capsys, ["-n", "2", "--bind-to", "none", script]))


def test_map_by_ranks_per_node(capsys, script, tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("a slots=4\nb slots=4\n")
    command = launcher_part(dry_run(capsys, ["--hostfile", str(hosts), "--map-by", "ppr:1:node", script]))
    assert command[command.index("-n") + 1] == "2" and "a:1,b:1" in command


def test_x_name_forwards_the_launchers_value(capsys, script):
    variables = exported(dry_run(capsys, ["-x", "ZOO_MODE", "-x", "OTHER=given", script],
                                 environ={**os.environ, "ZOO_MODE": "fast, with spaces"}))
    assert variables["ZOO_MODE"] == "fast, with spaces" and variables["OTHER"] == "given"


@pytest.mark.multirank
@pytest.mark.timeout(90)
def test_x_name_reaches_every_rank_of_a_real_job():
    """mpirun's habits end to end (-np, -x NAME). On one host the ranks would inherit NAME anyway; that mpirun
    carries it to other hosts rests on its -x list, which test_x_name_forwards_the_launchers_value shows."""
    program = RANK_HELPERS + "import os\nprint('ZOO_MODE', rank_of_env(), os.environ.get('ZOO_MODE'))\n"
    result = run_ranks(2, program, launcher_args=["-np", "2", "-x", "ZOO_MODE"], timeout=60,
                       env={"ZOO_MODE": "from the launcher"}).check()
    lines = sorted(line for rank in range(2) for line in result.rank_stdout[rank].splitlines()
                   if line.startswith("ZOO_MODE"))
    assert lines == ["ZOO_MODE 0 from the launcher", "ZOO_MODE 1 from the launcher"], result.stdout
