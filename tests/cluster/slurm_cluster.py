"""A private Slurm cluster for the tests: munged, slurmctld and one slurmd per node
from Debian's packages (`apt-get install slurm-wlm munge`; .ci/run installs them),
each started in the foreground with a private configuration, private ports, a
private munge key and socket, and state in a directory of its own; stopped by stop().

Two shapes (tests/cluster/slurm_fixture.py has a fixture for each):
  one_node(directory)            this machine is the one node (127.0.0.1)
  on_namespace_hosts(cluster)    one node per host of a namespace cluster
                                 (bench/cluster/netns_cluster.py), see below

Note [Slurm across namespace hosts]
  Each host's slurmd runs in the host's network namespace, with the host's hostname
  (= its NodeName) and /dev/shm, started through the cluster's launch agent as
  mpirun's daemons are; several slurmd on one machine need only distinct state,
  which slurm.conf gives them through %n (the node name) in SlurmdSpoolDir,
  SlurmdPidFile and SlurmdLogFile. All slurmd listen on the same SlurmdPort, each in
  its own namespace, at the NodeAddr of its host. slurmctld and munged run in the
  root namespace (the "login node"): slurmctld listens on the bridge address, and
  the munge socket is a path in the file system, which every namespace reaches. A
  batch job runs on the first node, in that host's namespace; mpirun started there
  by the tarantella launcher starts its daemon on the other node with srun
  (Open MPI's plm/slurm), so the ranks land one per host as Slurm allocated them.
  The root-namespace daemons are adopted by the namespace cluster, so that they die
  with it also when a killed test run leaves the cluster stale.
"""
from __future__ import annotations

import os
import secrets
import shlex
import shutil
import socket
import subprocess
import time

from tarantella.launcher.process_group import stop_process_group

__all__ = ["SlurmCluster", "SlurmStartError", "one_node", "on_namespace_hosts",
           "why_no_slurm"]

_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "salloc", "srun", "sinfo", "squeue",
          "scancel", "scontrol")
_UNFINISHED = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
               "RESIZING", "SIGNALING", "STAGE_OUT")
_UP_SECONDS = 40.0

_CONFIG = """\
ClusterName={name}
SlurmctldHost={ctld_name}({ctld_address})
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
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmdSpoolDir={dir}/spool-%n
StateSaveLocation={dir}/state
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd-%n.log
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=5
SlurmdTimeout={slurmd_timeout}
{nodes}
PartitionName=tnt Nodes={node_names} Default=YES MaxTime=30 State=UP OverSubscribe=YES
"""


# slurmd 22.05 always loads a cgroup plugin, and by default picks one by looking at
# /sys/fs/cgroup; inside a namespace host (`ip netns exec` mounts a fresh sysfs) no
# cgroup file system is there and slurmd stops. Naming the plugin skips that look;
# nothing here uses cgroups (proctrack/linuxproc, task/none).
_CGROUP_CONFIG = """\
CgroupPlugin=cgroup/v1
"""


class SlurmStartError(RuntimeError):
    """The daemons did not come up; the message says which and where the logs are."""


def why_no_slurm() -> str | None:
    """None if the daemons can be started here, else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "the test Slurm cluster needs root (its daemons run as root, as in CI)"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install slurm-wlm munge)"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _write_munge_key(path: str) -> None:
    """A key of this cluster's own: no other munged (the machine's, another test
    cluster's) can make credentials this cluster accepts."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(os.urandom(1024))


class SlurmCluster:
    """nodes: [(NodeName, NodeAddr, argv prefix that runs a command on that node)]."""

    def __init__(self, directory: str, controller: tuple[str, str],
                 nodes: list[tuple[str, str, list[str]]], cpus_per_node: int,
                 adopt=None, slurmd_timeout: int = 300):
        self.dir = directory
        self.slurmd_timeout = slurmd_timeout   # a node silent this long is DOWN (Slurm's default: 300 s)
        self.controller = controller
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.adopt = adopt or (lambda pid: None)
        self.conf = os.path.join(directory, "slurm.conf")
        self.env = {**os.environ, "SLURM_CONF": self.conf}
        for name in [name for name in self.env if name.startswith("SLURM_") and name != "SLURM_CONF"]:
            del self.env[name]  # a test session itself inside a job must not leak into ours
        self.processes: list[subprocess.Popen] = []
        self._log = None

    @property
    def node_names(self) -> list[str]:
        return [name for name, _, _ in self.nodes]

    def start(self) -> None:
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        for name in self.node_names:
            os.makedirs(os.path.join(self.dir, f"spool-{name}"), exist_ok=True)
        nodes = "\n".join(f"NodeName={name} NodeAddr={address} CPUs={self.cpus_per_node} "
                          f"State=UNKNOWN" for name, address, _ in self.nodes)
        with open(self.conf, "w") as handle:
            handle.write(_CONFIG.format(
                name=f"tnt{secrets.token_hex(4)}", ctld_name=self.controller[0],
                ctld_address=self.controller[1], dir=self.dir, ctld_port=_free_port(),
                slurmd_port=_free_port(), nodes=nodes, node_names=",".join(self.node_names),
                slurmd_timeout=self.slurmd_timeout))
        with open(os.path.join(self.dir, "cgroup.conf"), "w") as handle:
            handle.write(_CGROUP_CONFIG)
        _write_munge_key(os.path.join(self.dir, "munge.key"))
        self._log = log = open(os.path.join(self.dir, "daemons.out"), "w")
        d = self.dir
        self._spawn(["munged", "--foreground", "--force", f"--socket={d}/munge.socket",
                     f"--key-file={d}/munge.key", f"--pid-file={d}/munged.pid",
                     f"--log-file={d}/munged.log", f"--seed-file={d}/munged.seed"], log)
        self._wait_for(lambda: os.path.exists(f"{d}/munge.socket"), "munged")
        self._spawn(["slurmctld", "-D", "-i", "-c"], log)
        for name, _, prefix in self.nodes:
            command = ["slurmd", "-D", "-N", name]
            # exec: the agent's shell becomes slurmd, which stop() then waits for itself
            argv = [*prefix, "exec " + shlex.join(command)] if prefix else command
            self._spawn(argv, log, adopt=not prefix)  # a host's slurmd dies with its namespace
        self._wait_for(self._nodes_idle, "slurmctld and slurmd (every node idle)")

    def _spawn(self, argv: list[str], log, adopt: bool = True) -> subprocess.Popen:
        process = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
        self.processes.append(process)
        if adopt:
            self.adopt(process.pid)
        return process

    def node_states(self) -> dict[str, str]:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env,
                              capture_output=True, text=True, timeout=20)
        if done.returncode != 0:
            return {}
        return dict(line.split() for line in done.stdout.splitlines() if line.strip())

    def _nodes_idle(self) -> bool:
        states = self.node_states()
        return sorted(states) == sorted(self.node_names) and \
            all(state in ("idle", "mix", "alloc") for state in states.values())

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + _UP_SECONDS
        while time.monotonic() < deadline:
            dead = [shlex.join(p.args)[:60] for p in self.processes if p.poll() is not None]
            if dead:
                raise SlurmStartError(f"{', '.join(dead)} exited at start; {self.log_tail()}")
            if ready():
                return
            time.sleep(0.3)
        raise SlurmStartError(f"{what} not up after {_UP_SECONDS:g} s; {self.log_tail()}")

    def log_tail(self, lines: int = 4) -> str:
        """The last lines of every daemon log, for a message."""
        parts = []
        for entry in sorted(os.listdir(self.dir)):
            if entry.endswith((".log", ".out")):
                with open(os.path.join(self.dir, entry), errors="replace") as handle:
                    tail = handle.read().splitlines()[-lines:]
                if tail:
                    parts.append(f"{entry}: " + " | ".join(tail))
        return f"logs in {self.dir}: " + "; ".join(parts)

    def run(self, argv: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm command (sbatch --wait, salloc, ...) against this cluster."""
        return subprocess.run(argv, env={**self.env, **kwargs.pop("env", {})},
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kwargs)

    def batch(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """`sbatch ARGV` and wait for the job to end, as `sbatch --wait` does (returncode:
        the job's exit code, 128 + N if a signal N ended it), but looking every 0.3 s:
        sbatch --wait looks 2, 10 and 42 s after submitting, so a 15 s job took 42 s."""
        submitted = self.submit(argv)
        if submitted.returncode != 0:
            return submitted
        ended = self.wait(submitted.stdout.strip().split(";")[0], timeout)
        return subprocess.CompletedProcess(argv, ended, submitted.stdout, submitted.stderr)

    def submit(self, argv: list[str]) -> subprocess.CompletedProcess:
        """`sbatch --parsable ARGV`: its stdout is the job's id."""
        return self.run(["sbatch", "--parsable", *argv], timeout=30)

    def wait(self, job: str, timeout: float) -> int:
        """The job's exit code once it ended (see batch); cancelled and TimeoutExpired after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            ended = self._job_end(job)
            if ended is not None:
                return ended
            if time.monotonic() > deadline:
                subprocess.run(["scancel", job], env=self.env, capture_output=True, timeout=20)
                raise subprocess.TimeoutExpired(["sbatch", job], timeout)
            time.sleep(0.3)

    def job_fields(self, job: str) -> dict[str, str]:
        """`scontrol show job`'s fields (NodeList, JobState, ExitCode, ...)."""
        done = subprocess.run(["scontrol", "-o", "show", "job", job], env=self.env,
                              capture_output=True, text=True, timeout=20)
        return dict(word.split("=", 1) for word in done.stdout.split() if "=" in word)

    def _job_end(self, job: str) -> int | None:
        """The ended job's exit code, None while it is pending, running or completing."""
        fields = self.job_fields(job)
        if fields.get("JobState", "PENDING") in _UNFINISHED:
            return None
        code, _, signal_number = fields.get("ExitCode", "1:0").partition(":")
        if int(signal_number or 0):
            return 128 + int(signal_number)
        return int(code) if int(code) or fields["JobState"] == "COMPLETED" else 1

    def jobs(self) -> list[str]:
        done = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True,
                              text=True, timeout=20)
        return done.stdout.split() if done.returncode == 0 else []

    def stop(self) -> None:
        """Cancel what still runs, wait for it to end, stop the daemons (slurmd first,
        munged last; each with its process group, children included)."""
        if self.processes:
            try:
                subprocess.run(["scancel", "--full", "-u", "root"], env=self.env,
                               capture_output=True, timeout=20)
                deadline = time.monotonic() + 20
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.5)
            except subprocess.TimeoutExpired:
                pass
        for process in reversed(self.processes):
            stop_process_group(process, grace_seconds=15)
        self.processes.clear()
        if self._log is not None:
            self._log.close()
            self._log = None


def one_node(directory: str) -> SlurmCluster:
    """This machine as the one node of a cluster (slurmctld and slurmd on 127.0.0.1)."""
    node = socket.gethostname().split(".")[0]
    return SlurmCluster(directory, controller=(node, "127.0.0.1"),
                        nodes=[(node, "127.0.0.1", [])], cpus_per_node=os.cpu_count() or 1)


def on_namespace_hosts(cluster, cpus_per_node: int | None = None,
                       slurmd_timeout: int = 300) -> SlurmCluster:
    """One Slurm node per host of a namespace cluster (Note [Slurm across namespace
    hosts]); its state lives in the cluster's directory and dies with it."""
    controller = (socket.gethostname().split(".")[0], cluster.bridge_address)
    nodes = [(host, cluster.address(host), [cluster.agent, host]) for host in cluster.hosts]
    # Every host sees the machine's cores (they share them); declaring them all keeps
    # slurmd from reporting a configuration that differs from the hardware.
    return SlurmCluster(os.path.join(cluster.directory, "slurm"), controller, nodes,
                        cpus_per_node or os.cpu_count() or 1, adopt=cluster.adopt,
                        slurmd_timeout=slurmd_timeout)
