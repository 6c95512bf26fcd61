"""A one-node Slurm cluster for the tests: munged, slurmctld and slurmd from Debian's
packages (`apt-get install slurm-wlm munge`; .ci/run installs them), each started in
the foreground by this fixture with a private configuration, private ports, a
private munge socket and state in a temporary directory, and stopped afterwards.

    def test_x(slurm):
        done = slurm.run(["sbatch", "-n", "2", "--wait", "--wrap", "..."], timeout=120)

`slurm.env` (SLURM_CONF=...) points Slurm's commands at this cluster. Where the
daemons cannot run (not root, packages missing, the node does not come up), the
tests skip with the reason.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time

import pytest

__all__ = ["slurm", "SlurmCluster"]

_DAEMONS = ("munged", "slurmctld", "slurmd")
_MUNGE_KEY = "/etc/munge/munge.key"
_UP_SECONDS = 30.0

_CONFIG = """\
ClusterName={name}
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge.socket
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SlurmUser=root
SlurmdUser=root
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmdSpoolDir={dir}/spool
StateSaveLocation={dir}/state
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=5
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=tnt Nodes={node} Default=YES MaxTime=30 State=UP OverSubscribe=YES
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def why_no_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the one-node Slurm cluster needs root (its daemons run as root, as in CI)"
    missing = [tool for tool in (*_DAEMONS, "sbatch", "salloc", "srun", "sinfo")
               if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    if not os.path.isfile(_MUNGE_KEY):
        return f"no munge key at {_MUNGE_KEY} (the munge package creates it)"
    return None


class SlurmCluster:
    def __init__(self, directory: str):
        self.dir = directory
        self.node = socket.gethostname().split(".")[0]
        self.conf = os.path.join(directory, "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        for name in [name for name in self.env if name.startswith("SLURM_") and name != "SLURM_CONF"]:
            del self.env[name]  # a test session itself inside a job must not leak into ours
        self.processes: list[subprocess.Popen] = []

    def start(self) -> None:
        os.makedirs(os.path.join(self.dir, "spool"))
        os.makedirs(os.path.join(self.dir, "state"))
        with open(self.conf, "w") as handle:
            handle.write(_CONFIG.format(name=f"tnt{os.getpid()}", node=self.node, dir=self.dir,
                                        ctld_port=_free_port(), slurmd_port=_free_port(),
                                        cpus=os.cpu_count() or 1))
        log = open(os.path.join(self.dir, "daemons.out"), "w")
        self._spawn(["munged", "--foreground", "--force", f"--socket={self.dir}/munge.socket",
                     f"--key-file={_MUNGE_KEY}", f"--pid-file={self.dir}/munged.pid",
                     f"--log-file={self.dir}/munged.log", f"--seed-file={self.dir}/munged.seed"],
                    log)
        self._wait_for(lambda: os.path.exists(f"{self.dir}/munge.socket"), "munged")
        self._spawn(["slurmctld", "-D", "-i", "-c"], log)
        self._spawn(["slurmd", "-D"], log)
        self._wait_for(self._node_idle, "slurmctld and slurmd (node idle)")

    def _spawn(self, argv: list[str], log) -> None:
        self.processes.append(subprocess.Popen(argv, env=self.env, stdout=log, stderr=log,
                                               stdin=subprocess.DEVNULL, start_new_session=True))

    def _node_idle(self) -> bool:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%t"], env=self.env,
                              capture_output=True, text=True, timeout=20)
        return done.returncode == 0 and done.stdout.strip() in ("idle", "mix", "alloc")

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + _UP_SECONDS
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited at start; see {self.dir}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"{what} not up after {_UP_SECONDS:g} s; see {self.dir}")

    def run(self, argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm command (sbatch --wait, salloc, ...) against this cluster."""
        return subprocess.run(argv, env={**self.env, **kwargs.pop("env", {})},
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kwargs)

    def _jobs(self) -> list[str]:
        done = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True,
                              text=True, timeout=20)
        return done.stdout.split() if done.returncode == 0 else []

    def stop(self) -> None:
        """Cancel what still runs, wait for it to end, stop the daemons."""
        if self.processes:
            subprocess.run(["scancel", "--full", "-u", "root"], env=self.env,
                           capture_output=True, timeout=20)
            deadline = time.monotonic() + 20
            while self._jobs() and time.monotonic() < deadline:
                time.sleep(0.5)
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()


@pytest.fixture(scope="module")
def slurm():
    reason = why_no_slurm()
    if reason:
        pytest.skip(f"no Slurm: {reason}")
    directory = tempfile.mkdtemp(prefix="tnt-slurm-")
    cluster = SlurmCluster(directory)
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as error:
        cluster.stop()
        pytest.skip(f"the one-node Slurm cluster did not start: {error}")
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
