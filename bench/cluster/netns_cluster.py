"""A cluster of H hosts on one machine: one network namespace per host.

Each host is a network namespace with its own hostname (a UTS namespace made by
the launch agent), its own /dev/shm and one veth link to a bridge in the root
namespace. The bridge carries a private /24 subnet (10.213.N.0/24, N free on this
machine) and its address .1, so that mpirun started in the root namespace (the
"login node") reaches every host; host i has address .(10 + i).

    cluster = create(hosts=2, slots=1)
    tarantella  *cluster.launcher_args()  -- train.py
    cluster.down()

launcher_args() are `--hostfile FILE --launch-agent AGENT --network-interface SUBNET`:
the agent (a small script written per cluster) runs mpirun's daemon command in
the host's namespace as `ip netns exec NS unshare --uts --mount ... hostname NS;
mount --bind SHM /dev/shm; CMD`, so MPI_Comm_split_type(SHARED) sees one node per
host, and a host's shared-memory segments land in that host's own directory
(cluster.shm_entries(host) lists what a job left behind).

Note [Cluster lifetime]
  Every cluster records its owner's pid in /run/tnt-netns/NAME/state.json. down()
  kills what still runs in its namespaces, deletes them, the bridge and the
  directory. A test fixture calls down() in a finalizer; a run that was killed
  before it could (SIGKILL, a crashed CI job) leaves a cluster whose owner is dead:
  remove_stale() (called by every create()) removes those. Clusters of live owners
  (another test session, a benchmark) are never touched. Names start with PREFIX
  and a short random id, so concurrent sessions never collide; interface names
  stay within Linux's 15 characters.

Requires root, `ip` (iproute2) and `unshare`; why_unavailable() says what is missing.
"""
from __future__ import annotations

import dataclasses
import fcntl
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import time

__all__ = ["NetnsCluster", "ClusterError", "create", "remove_stale", "why_unavailable",
           "list_clusters", "load", "PREFIX", "STATE_ROOT"]

PREFIX = "tnt"
STATE_ROOT = "/run/tnt-netns"
_SUBNET_BASE = "10.213"
_FIRST_HOST_OCTET = 10


class ClusterError(RuntimeError):
    """The cluster cannot be made or changed; the message says why."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise ClusterError(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def why_unavailable() -> str | None:
    """None if namespaces can be made here, else the reason (for pytest.skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root (run the tests as root, as CI does)"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (apt-get install iproute2 util-linux mount)"
    probe = f"probe-netns-{os.getpid()}"  # outside PREFIX: never taken for stale
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    try:
        inside = subprocess.run(["ip", "netns", "exec", probe, "unshare", "--uts", "--mount",
                                 "true"], capture_output=True, text=True, timeout=30)
        if inside.returncode != 0:
            return f"cannot enter a namespace with its own hostname: {inside.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


_AGENT = """#!/bin/sh
# Launch agent of the namespace cluster {name} (written by bench/cluster/netns_cluster.py):
# `agent HOST COMMAND...` runs COMMAND in HOST's namespace, hostname and /dev/shm,
# the way `ssh HOST COMMAND...` would on a real cluster.
host="$1"; shift
case " {hosts} " in
  *" $host "*) ;;
  *) echo "netns agent: no host '$host' in cluster {name} (hosts: {hosts})" >&2; exit 255 ;;
esac
exec ip netns exec "$host" unshare --uts --mount --propagation private \\
  sh -c "hostname $host && mount --bind {shm}/$host /dev/shm && cd / && $*"
"""


@dataclasses.dataclass
class NetnsCluster:
    name: str               # also the prefix of every namespace and interface
    hosts: list[str]        # host names = namespace names, in rank order
    slots: int              # ranks each host takes (slots=K in the hostfile)
    subnet: str             # the cluster network, e.g. 10.213.5.0/24
    owner_pid: int          # the process whose death makes the cluster stale

    @property
    def directory(self) -> str:
        return os.path.join(STATE_ROOT, self.name)

    @property
    def bridge(self) -> str:
        return f"{self.name}br"

    @property
    def hostfile(self) -> str:
        return os.path.join(self.directory, "hostfile")

    @property
    def agent(self) -> str:
        return os.path.join(self.directory, "agent")

    @property
    def shm_root(self) -> str:
        return os.path.join(self.directory, "shm")

    def veth(self, host: str) -> str:
        """The root-namespace end of the host's link (its statistics count the host's
        traffic: tx_bytes here is what the host received, rx_bytes what it sent)."""
        return f"{self.name}v{self.hosts.index(host)}"

    def address(self, host: str) -> str:
        network = ipaddress.ip_network(self.subnet)
        return str(network.network_address + _FIRST_HOST_OCTET + self.hosts.index(host))

    @property
    def bridge_address(self) -> str:
        """The root namespace's address on the cluster network (the "login node")."""
        return str(ipaddress.ip_network(self.subnet).network_address + 1)

    def adopt(self, pid: int) -> None:
        """Have down() also stop a process of the root namespace that serves the
        cluster (e.g. a Slurm controller): it is stopped with the cluster, also when
        the cluster is removed as stale (Note [Cluster lifetime])."""
        with open(os.path.join(self.directory, "adopted"), "a") as handle:
            handle.write(f"{pid} {_start_time(pid)}\n")

    def launcher_args(self) -> list[str]:
        """What `tarantella` needs to run on this cluster."""
        return ["--hostfile", self.hostfile, "--launch-agent", self.agent,
                "--network-interface", self.subnet]

    # --- looking at the hosts -------------------------------------------------
    def run_on(self, host: str, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run a command on a host (through the agent, as mpirun does)."""
        return subprocess.run([self.agent, host, shlex.join(command)], **kwargs)

    def pids(self, host: str) -> list[int]:
        """Processes running in the host's network namespace."""
        done = _ip("netns", "pids", host, check=False)
        return [int(word) for word in done.stdout.split() if word.isdigit()]

    def shm_entries(self, host: str) -> list[str]:
        """What is in the host's /dev/shm."""
        try:
            return sorted(os.listdir(os.path.join(self.shm_root, host)))
        except FileNotFoundError:
            return []

    def leftovers(self) -> dict[str, dict]:
        """{host: {"processes": [...], "shm": [...]}} for hosts with anything left."""
        found = {}
        for host in self.hosts:
            processes = [_describe_pid(pid) for pid in self.pids(host)]
            shm = self.shm_entries(host)
            if processes or shm:
                found[host] = {"processes": processes, "shm": shm}
        return found

    def wait_until_clean(self, timeout: float) -> dict[str, dict]:
        """leftovers() once it is empty or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.leftovers()
            if not found or time.monotonic() >= deadline:
                return found
            time.sleep(0.2)

    def link_bytes(self, host: str) -> dict[str, int]:
        """Bytes the host sent and received over its link so far."""
        base = f"/sys/class/net/{self.veth(host)}/statistics"
        with open(f"{base}/rx_bytes") as rx, open(f"{base}/tx_bytes") as tx:
            return {"sent": int(rx.read()), "received": int(tx.read())}

    # --- faults ---------------------------------------------------------------
    def cut_link(self, host: str) -> None:
        """The host's cable is pulled: both ends of its link go down."""
        _ip("link", "set", self.veth(host), "down")
        _ip("-n", host, "link", "set", "eth0", "down")

    def restore_link(self, host: str) -> None:
        _ip("-n", host, "link", "set", "eth0", "up")
        _ip("link", "set", self.veth(host), "up")

    def kill_all(self) -> None:
        """SIGKILL everything running on the hosts (SIGCONT first: a stopped process
        would otherwise keep its segments mapped)."""
        for host in self.hosts:
            for pid in self.pids(host):
                for signum in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(pid, signum)
                    except ProcessLookupError:
                        pass

    def clear_shm(self) -> None:
        for host in self.hosts:
            for entry in self.shm_entries(host):
                path = os.path.join(self.shm_root, host, entry)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass

    def _stop_adopted(self) -> None:
        try:
            with open(os.path.join(self.directory, "adopted")) as handle:
                adopted = [line.split() for line in handle if line.strip()]
        except FileNotFoundError:
            return
        for pid, started in adopted:  # the start time tells a reused pid apart
            if _start_time(int(pid)) == started:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def down(self) -> None:
        """Remove everything the cluster made (idempotent)."""
        self._stop_adopted()
        self.kill_all()
        deadline = time.monotonic() + 5
        while any(self.pids(host) for host in self.hosts) and time.monotonic() < deadline:
            time.sleep(0.1)
        for host in self.hosts:
            _ip("netns", "del", host, check=False)
        _ip("link", "del", self.bridge, check=False)
        subprocess.run(["umount", "-l", self.shm_root], capture_output=True, timeout=30)
        shutil.rmtree(self.directory, ignore_errors=True)

    def describe(self) -> dict:
        return {"name": self.name, "hosts": self.hosts, "slots": self.slots,
                "subnet": self.subnet, "owner_pid": self.owner_pid, "hostfile": self.hostfile,
                "agent": self.agent, "launcher_args": self.launcher_args(),
                "addresses": {host: self.address(host) for host in self.hosts}}


def _describe_pid(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = handle.read().decode(errors="replace").split("\0")
        return f"{pid}: {' '.join(words).strip()[:200]}"
    except OSError:
        return f"{pid}: (gone)"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as dead
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def load(name: str) -> NetnsCluster:
    path = os.path.join(STATE_ROOT, name, "state.json")
    try:
        with open(path) as handle:
            state = json.load(handle)
    except (OSError, ValueError) as error:
        raise ClusterError(f"no cluster {name!r} ({path}: {error})") from None
    return NetnsCluster(**state)


def list_clusters() -> list[NetnsCluster]:
    found = []
    if os.path.isdir(STATE_ROOT):
        for name in sorted(os.listdir(STATE_ROOT)):
            if os.path.isfile(os.path.join(STATE_ROOT, name, "state.json")):
                try:
                    found.append(load(name))
                except ClusterError:
                    continue
    return found


def _orphans(prefix: str) -> tuple[list[str], list[str]]:
    """Namespaces and bridges named like clusters but with no state directory
    (a creator killed between its first `ip` call and writing state.json)."""
    known = set(os.listdir(STATE_ROOT)) if os.path.isdir(STATE_ROOT) else set()

    def stale(name: str) -> bool:
        return name.startswith(prefix) and not any(name.startswith(k) for k in known)
    namespaces = [line.split()[0] for line in _ip("netns", "list").stdout.splitlines() if line]
    links = [line.split(":")[1].strip().split("@")[0]
             for line in _ip("-o", "link", "show", "type", "bridge").stdout.splitlines()]
    return [n for n in namespaces if stale(n)], [b for b in links if stale(b)]


def remove_stale(prefix: str = PREFIX) -> list[str]:
    """Remove clusters whose owner process has died (Note [Cluster lifetime])."""
    removed = []
    with _lock():
        for cluster in list_clusters():
            if cluster.name.startswith(prefix) and not _alive(cluster.owner_pid):
                cluster.down()
                removed.append(cluster.name)
        namespaces, bridges = _orphans(prefix)
        for namespace in namespaces:
            for pid in _ip("netns", "pids", namespace, check=False).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", namespace, check=False)
            removed.append(namespace)
        for bridge in bridges:
            _ip("link", "del", bridge, check=False)
            removed.append(bridge)
    return removed


class _lock:
    """Serialises cluster creation and removal on this machine (subnet choice)."""

    def __enter__(self):
        os.makedirs(STATE_ROOT, exist_ok=True)
        self.handle = open(os.path.join(STATE_ROOT, ".lock"), "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def _free_subnet() -> str:
    used = set()
    for line in _ip("-o", "-4", "addr", "show").stdout.splitlines():
        words = line.split()
        if "inet" in words:
            used.add(ipaddress.ip_interface(words[words.index("inet") + 1]).network)
    for cluster in list_clusters():
        used.add(ipaddress.ip_network(cluster.subnet))
    for third in range(1, 255):
        candidate = ipaddress.ip_network(f"{_SUBNET_BASE}.{third}.0/24")
        if not any(candidate.overlaps(network) for network in used):
            return str(candidate)
    raise ClusterError(f"no free /24 subnet left in {_SUBNET_BASE}.0.0/16")


def create(hosts: int, slots: int = 1, prefix: str = PREFIX,
           owner_pid: int | None = None) -> NetnsCluster:
    """Bring up `hosts` hosts with `slots` slots each; the caller must call down()
    (Note [Cluster lifetime]). owner_pid defaults to the calling process."""
    if not 1 <= hosts <= 200:
        raise ClusterError(f"hosts must be 1..200, got {hosts}")
    if slots < 1:
        raise ClusterError(f"slots must be at least 1, got {slots}")
    reason = why_unavailable()
    if reason:
        raise ClusterError(reason)
    remove_stale(prefix)
    with _lock():
        name = f"{prefix}{secrets.token_hex(3)}"  # e.g. tnt3fa2c1: bridge tnt3fa2c1br
        cluster = NetnsCluster(name=name, hosts=[f"{name}-h{i}" for i in range(hosts)],
                               slots=slots, subnet=_free_subnet(),
                               owner_pid=owner_pid or os.getpid())
        os.makedirs(cluster.shm_root)
        with open(os.path.join(cluster.directory, "state.json"), "w") as handle:
            json.dump(dataclasses.asdict(cluster), handle)
        try:
            _build(cluster)
        except BaseException:
            cluster.down()
            raise
    return cluster


def _build(cluster: NetnsCluster) -> None:
    network = ipaddress.ip_network(cluster.subnet)
    # A tmpfs for the hosts' /dev/shm: shared memory stays in memory, as on a host.
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", f"{cluster.name}shm",
                    cluster.shm_root], check=True, capture_output=True, timeout=30)
    _ip("link", "add", cluster.bridge, "type", "bridge")
    _ip("addr", "add", f"{network.network_address + 1}/{network.prefixlen}", "dev", cluster.bridge)
    _ip("link", "set", cluster.bridge, "up")
    for host in cluster.hosts:
        os.makedirs(os.path.join(cluster.shm_root, host), mode=0o1777)
        os.chmod(os.path.join(cluster.shm_root, host), 0o1777)
        _ip("netns", "add", host)
        _ip("link", "add", cluster.veth(host), "type", "veth", "peer", "name", "eth0",
            "netns", host)
        _ip("link", "set", cluster.veth(host), "master", cluster.bridge, "up")
        _ip("-n", host, "addr", "add", f"{cluster.address(host)}/{network.prefixlen}",
            "dev", "eth0")
        _ip("-n", host, "link", "set", "eth0", "up")
        _ip("-n", host, "link", "set", "lo", "up")
    with open(cluster.hostfile, "w") as handle:
        handle.write(f"# namespace cluster {cluster.name}: {len(cluster.hosts)} hosts\n")
        handle.writelines(f"{host} slots={cluster.slots}\n" for host in cluster.hosts)
    with open(cluster.agent, "w") as handle:
        handle.write(_AGENT.format(name=cluster.name, hosts=" ".join(cluster.hosts),
                                   shm=cluster.shm_root))
    os.chmod(cluster.agent, 0o755)
