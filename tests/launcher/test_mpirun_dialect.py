"""mpirun's and horovodrun's flags as their users type them by habit (issue 22 §3): each means what it
means there, or is refused with one line saying what to write in tarantella's dialect.

    -np N                      -n N (mpirun, horovodrun)
    -H h1:2,h2:2, -H h1,h2     hosts and their slots (also --host, -host; MPICH's -hosts)
    --hostfile FILE            hosts from FILE (also mpirun's -hostfile)
    -N N, --npernode N         ranks per host (also -npernode; MPICH's -ppn); mpirun's -N, not srun's
    --bind-to core|none|socket core (the default) binds each local rank to its share of the cores; none
                               does not; socket means --pin-to-socket; hwthread, ... refused
    --map-by slot|ppr:N:node   slot is tarantella's placement; ppr:N:node is --npernode N; others refused
    -x NAME, -x NAME=VALUE     NAME with the launcher's value (refused if unset), or VALUE
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tarantella.launcher.cli import main
from tests.multirank import RANK_HELPERS, REPO_ROOT

from .dry_run import (MPICH_LAUNCHER, OPENMPI_LAUNCHER, USER_HOST, dry_run, exported, launcher_part,
                      program_part, wrapper_part)
from .test_pinning import NODES


@pytest.fixture
def hosts(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("a slots=4\nb slots=4\n")
    return str(path)


def _option(command, name):
    part = launcher_part(command)
    return part[part.index(name) + 1] if name in part else None


def _refusal(capsys, argv, **machine) -> str:
    """The one line `tarantella argv` refuses argv with (asserting exit code 2 and no output)."""
    machine.setdefault("launcher", OPENMPI_LAUNCHER)
    machine.setdefault("local_host", USER_HOST)
    code = main(argv, **machine)
    out, err = capsys.readouterr()
    assert (code, out) == (2, ""), (code, out, err)
    assert err.startswith("tarantella: error: ") and err.count("\n") == 1, err
    return err


# ---- -np, -H, --hostfile, -N/--npernode: the same meaning as in mpirun ----------------------------

def test_np_is_the_number_of_ranks(capsys, script):
    assert _option(dry_run(capsys, ["-np", "3", script]), "-n") == "3"
    assert dry_run(capsys, ["-np", "3", script]) == dry_run(capsys, ["-n", "3", script])


def test_n_per_node_as_in_mpirun(capsys, script, hosts):
    assert _option(dry_run(capsys, ["-N", "2", script]), "-n") == "2"   # one host: n = ranks per node
    command = dry_run(capsys, ["--hostfile", hosts, "-N", "2", script])
    assert (_option(command, "-n"), _option(command, "--host"), _option(command, "--map-by")) == \
        ("4", "a:2,b:2", "ppr:2:node")
    for spelling in ("--npernode", "-npernode", "-ppn", "--n-per-node"):
        assert dry_run(capsys, ["--hostfile", hosts, spelling, "2", script]) == command, spelling


def test_hosts_with_and_without_counts(capsys, script):
    assert _option(dry_run(capsys, ["-H", "a,b", script]), "--host") == "a:1,b:1"
    command = dry_run(capsys, ["-H", "a:2,b:2", script])
    assert (_option(command, "-n"), _option(command, "--host")) == ("4", "a:2,b:2")
    for spelling in ("--host", "-host", "-hosts"):
        assert dry_run(capsys, [spelling, "a:2,b:2", script]) == command, spelling
    # horovodrun -np 3 -H a:2,b:2: the hosts' slots filled in order
    assert _option(dry_run(capsys, ["-np", "3", "-H", "a:2,b:2", script]), "--host") == "a:2,b:1"


def test_hostfile_and_its_single_dash_spelling(capsys, script, hosts):
    command = dry_run(capsys, ["--hostfile", hosts, script])
    assert (_option(command, "-n"), _option(command, "--host")) == ("8", "a:4,b:4")
    assert dry_run(capsys, ["-hostfile", hosts, script]) == command
    assert dry_run(capsys, [f"-hostfile={hosts}", script]) == command


def test_mpich_gets_hosts_and_ranks_per_node(capsys, script, hosts):
    words = launcher_part(dry_run(capsys, ["-np", "4", "-hostfile", hosts, "-N", "2", script],
                                  launcher=MPICH_LAUNCHER))
    assert words[words.index("-n") + 1] == "4" and words[words.index("-hosts") + 1] == "a:2,b:2"
    assert words[words.index("-ppn") + 1] == "2"


# ---- --bind-to and --map-by ----------------------------------------------------------------------

def test_bind_to_socket_pins_and_none_does_not(capsys, script):
    pinned = wrapper_part(dry_run(capsys, ["-n", "2", "--bind-to", "socket", script], probe_numa=lambda: NODES))
    assert pinned[:2] == ["--local-rank-prefix", "numactl --cpunodebind=0 --preferred=0"]
    assert pinned == wrapper_part(dry_run(capsys, ["-n", "2", "--pin-to-socket", script],
                                          probe_numa=lambda: NODES))
    for value in ("numa", "package", "socket:overload-allowed"):
        assert wrapper_part(dry_run(capsys, ["-n", "2", "--bind-to", value, script],
                                    probe_numa=lambda: NODES)) == pinned, value
    assert "--bind-cores" not in pinned
    unbound = dry_run(capsys, ["-n", "2", "--bind-to", "none", script])
    assert "--local-rank-prefix" not in unbound and "--bind-cores" not in wrapper_part(unbound)
    bound = dry_run(capsys, ["-n", "2", script])
    assert "--bind-cores" in wrapper_part(bound)
    assert bound == dry_run(capsys, ["-n", "2", "--bind-to", "core", script])
    in_slurm = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_NTASKS": "2"}
    assert "--bind-cores" not in wrapper_part(dry_run(capsys, ["-n", "2", script], environ=in_slurm)), \
        "in Slurm, binding is srun's"


def test_map_by_ranks_per_node(capsys, script, hosts):
    command = dry_run(capsys, ["--hostfile", hosts, "--map-by", "ppr:1:node", script])
    assert (_option(command, "-n"), _option(command, "--host")) == ("2", "a:1,b:1")
    assert command == dry_run(capsys, ["--hostfile", hosts, "--npernode", "1", script])
    assert command == dry_run(capsys, ["--hostfile", hosts, "--map-by", "PPR:1:NODE", "-N", "1", script])


def test_map_by_slot_is_tarantellas_own_placement(capsys, script, hosts):
    for argv in (["-n", "5", "--hostfile", hosts, script], ["-H", "a:2,b:2", "-n", "3", script],
                 ["-n", "2", script]):
        assert dry_run(capsys, ["--map-by", "slot", *argv]) == dry_run(capsys, argv), argv
    assert _option(dry_run(capsys, ["--map-by", "slot", "-n", "5", "--hostfile", hosts, script]),
                   "--host") == "a:4,b:1"


# What is refused, and words the one-line error must contain: what was wrong and what to write.
REFUSED = {
    "--bind-to hwthread": (["--bind-to", "hwthread"], ["--bind-to hwthread", "--bind-to core", "--bind-to socket",
                                                       "--bind-to none"]),
    "--bind-to none with pinning": (["--bind-to", "none", "--pin-to-socket"], ["contradicts"]),
    "--bind-to socket, too many ranks": (["-n", "4", "--bind-to", "socket"],
                                         ["2 NUMA node(s)", "--npernode 2", "--bind-to socket"]),
    "--map-by node": (["--map-by", "node"], ["--map-by node", "--npernode N", "-H host:N"]),
    "--map-by socket": (["--map-by", "ppr:2:socket"], ["--map-by ppr:2:socket", "--npernode N"]),
    "--map-by with a modifier": (["--map-by", "ppr:2:node:PE=4"], ["--map-by ppr:2:node:PE=4"]),
    "--map-by ppr:0:node": (["--map-by", "ppr:0:node"], ["--map-by ppr:0:node", "N >= 1"]),
    "--map-by and -N disagree": (["--map-by", "ppr:2:node", "-N", "3"], ["--map-by ppr:2:node", "disagree"]),
    "srun's -N as a node count": (["-N", "2", "-n", "8"], ["-n 8", "disagree", "srun", "-H"]),
    "-H with a host twice": (["-H", "a,a"], ["'a'", "a:2"]),
    "-x NAME not set": (["-x", "TNT_TEST_SURELY_UNSET_VARIABLE"],
                        ["-x TNT_TEST_SURELY_UNSET_VARIABLE: TNT_TEST_SURELY_UNSET_VARIABLE is not set",
                         "-x TNT_TEST_SURELY_UNSET_VARIABLE=VALUE"]),
    "-x bad name": (["-x", "1FOO"], ["'1FOO' is not a valid environment variable name"]),
    "-x bad name with a value": (["-x", "A-B=2"], ["'A-B' is not a valid"]),
    "-bind-to, single dash": (["-bind-to", "core"], ["-bind-to"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_in_one_line_saying_what_to_write(case, capsys, script):
    argv, needed = REFUSED[case]
    environ = {name: value for name, value in os.environ.items() if name != "TNT_TEST_SURELY_UNSET_VARIABLE"}
    err = _refusal(capsys, [*argv, script], environ=environ, probe_numa=lambda: NODES)
    for words in needed:
        assert words in err, (words, err)


def test_flags_after_the_program_are_the_programs(capsys, script):
    tail = ["-np", "4", "-H", "a,b", "--hostfile", "h", "-N", "2", "--bind-to", "core", "--map-by", "node",
            "-x", "UNSET_HERE"]
    command = dry_run(capsys, [script, *tail])
    assert program_part(command) == [sys.executable, script, *tail]
    assert (_option(command, "-n"), _option(command, "--host"), _option(command, "--map-by")) == ("1", None, None)


# ---- -x ------------------------------------------------------------------------------------------

def test_x_name_forwards_the_launchers_value(capsys, script):
    environ = {**os.environ, "ZOO_MODE": "fast, with spaces", "ZOO_EQ": "a=b=c", "ZOO_NOT_ASKED": "1"}
    argv = ["-x", "ZOO_MODE", "-x", "OTHER=given", "-x", "ZOO_EQ", "-x", "EMPTY=", script]
    for launcher in (OPENMPI_LAUNCHER, MPICH_LAUNCHER):
        variables = exported(dry_run(capsys, argv, environ=environ, launcher=launcher))
        assert (variables["ZOO_MODE"], variables["OTHER"], variables["ZOO_EQ"], variables["EMPTY"]) == \
            ("fast, with spaces", "given", "a=b=c", ""), launcher.kind
        assert "ZOO_NOT_ASKED" not in variables


def test_x_name_takes_the_value_of_the_environment_given_to_the_launcher(capsys, script):
    """The environment main() is handed, not the test process's own."""
    assert "ZOO_ONLY_GIVEN" not in os.environ
    variables = exported(dry_run(capsys, ["-x", "ZOO_ONLY_GIVEN", script],
                                 environ={**os.environ, "ZOO_ONLY_GIVEN": "handed over"}))
    assert variables["ZOO_ONLY_GIVEN"] == "handed over"


def test_x_name_of_a_setting_resolves_it(capsys, script):
    variables = exported(dry_run(capsys, ["-x", "TNT_LOG_LEVEL", script],
                                 environ={**os.environ, "TNT_LOG_LEVEL": "DEBUG"}))
    assert variables["TNT_LOG_LEVEL"] == "DEBUG"


def test_help_describes_x_and_the_aliases(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for needed in ("-x KEY=VALUE, -x KEY", "as mpirun -x KEY; an error if", "-np N", "-hostfile",
                   "-host", "-hosts", "-npernode", "-ppn", "mpirun's -N", "srun's -N",
                   "--bind-to core|none|socket", "--map-by slot|ppr:N:node"):
        assert needed in out, needed


# ---- a real job ----------------------------------------------------------------------------------

# The launcher, with ZOO_MODE and ZOO_CONTROL in the environment it reads but not in the one mpirun
# inherits: as on another host, a rank can only have them through mpirun's -x.
_LAUNCHER_WITHOUT_INHERITANCE = """
import os, sys
from tarantella.launcher.cli import main
environ = dict(os.environ)
del os.environ["ZOO_MODE"], os.environ["ZOO_CONTROL"]
sys.exit(main(sys.argv[1:], environ=environ))
"""

_PRINT_ENV = RANK_HELPERS + """
import os
print("ZOO", rank_of_env(), os.environ.get("ZOO_MODE"), os.environ.get("ZOO_CONTROL"))
"""


@pytest.mark.multirank
@pytest.mark.timeout(90)
def test_x_name_reaches_every_rank_of_a_real_job(tmp_path):
    """`tarantella -np 2 -x ZOO_MODE`: both ranks see the launcher's value. ZOO_CONTROL, set the same way but
    not given with -x, must not arrive: it shows the ranks did not simply inherit the launcher's environment."""
    program = tmp_path / "print_env.py"
    program.write_text(_PRINT_ENV)
    command = [sys.executable, "-c", _LAUNCHER_WITHOUT_INHERITANCE, "-np", "2", "--output-on-all-devices",
               "-x", "ZOO_MODE", "--", str(program)]
    env = {**os.environ, "ZOO_MODE": "from the launcher, 2 words", "ZOO_CONTROL": "inherited",
           "PYTHONPATH": os.pathsep.join([REPO_ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])}
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, start_new_session=True, text=True, cwd=tmp_path)
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate(timeout=10)
        pytest.fail(f"the job did not end within 60 s\n{stdout}\n{stderr}")
    assert process.returncode == 0, stderr
    lines = sorted(line for line in stdout.splitlines() if " ZOO " in line)
    assert lines == ["[0] ZOO 0 from the launcher, 2 words None",
                     "[1] ZOO 1 from the launcher, 2 words None"], (stdout, stderr)
