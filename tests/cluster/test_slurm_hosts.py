"""tarantella under Slurm on two hosts: one slurmd per namespace host
(tests/cluster/slurm_fixture.py `slurm_on_hosts`; Note [Slurm across namespace hosts]).
A `sbatch -N 2 -n 2` job and a `salloc -N 2 -n 2` from the login node each form one
2-rank world with one rank per host, train alike on both, and a failing rank ends
the job naming its rank and host; nothing is left on the hosts afterwards. An elastic
`sbatch --no-kill` job that loses a node goes on without it."""
from __future__ import annotations

import re
import shlex
import time

import pytest

from tests.cluster.results import rank_results
from tests.cluster.slurm_fixture import slurm_on_hosts  # noqa: F401  (the fixture)
from tests.cluster.test_elastic_hosts import EXACT, EXACT_ARGS, _exact_reference, _lines
from tests.cluster.test_elastic_hosts import PROGRAM as ELASTIC_FIT
from tests.cluster.test_slurm import FAIL_RANK_1, JOB_ENV, LAUNCHER, PROGRAM
from tests.multirank import REPO_ROOT

# What runs on a host between jobs: its slurmd.
_DAEMON_COMMANDS = ("slurmd -D",)


def _job_leftovers(slurm, timeout: float = 20.0) -> dict[str, dict]:
    """What a finished job left on the hosts: processes other than slurmd, and
    /dev/shm entries; {} once there is nothing (waits up to `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        found = {}
        for host, left in slurm.hosts.leftovers().items():
            processes = [entry for entry in left["processes"]
                         if not entry.split(": ", 1)[-1].startswith(_DAEMON_COMMANDS)]
            if processes or left["shm"]:
                found[host] = {"processes": processes, "shm": left["shm"]}
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


def _under_srun_daemon(ancestors: list[str]) -> bool:
    """The rank was started by mpirun's daemon (prted), which a Slurm step started
    (slurmstepd: srun's work on that node), i.e. mpirun used srun, not ssh or an agent."""
    if "prted" not in ancestors:
        return False
    above = [name for name in ancestors[ancestors.index("prted"):] if name != "prted"]
    return above[:1] == ["slurmstepd"]


def _check_one_rank_per_host(found: dict[int, dict], hosts: list[str], text: str) -> None:
    assert sorted(found) == [0, 1], text
    assert sorted(values["host"] for values in found.values()) == sorted(hosts), found
    for values in found.values():
        assert values["size"] == 2 and values["allreduce_ok"], values
        assert values["on_one_node"] is False, values       # MPI_Comm_split_type(SHARED)
        assert values["node_count"] == 2, values
        assert values["local_rank"] == 0 and values["local_size"] == 1, values


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_sbatch_on_two_nodes_trains_one_world_with_a_rank_per_host(slurm_on_hosts, tmp_path):
    hosts = slurm_on_hosts.hosts.hosts
    out = tmp_path / "job.out"
    command = shlex.join([*LAUNCHER, "--timeout", "123", "--output-on-all-devices", "--",
                          PROGRAM])
    done = slurm_on_hosts.batch(
        ["-N", "2", "-n", "2", "-c", "1", "--time=4", "-o", str(out), "--wrap",
         f'echo "batch host $(hostname), nodes $SLURM_JOB_NUM_NODES"; {JOB_ENV} {command}'],
        timeout=280)
    text = out.read_text() if out.exists() else ""
    assert done.returncode == 0, done.stderr + text
    assert f"batch host {hosts[0]}, nodes 2" in text, text  # the script runs on a node
    found = rank_results(text)
    _check_one_rank_per_host(found, hosts, text)
    by_host = {values["host"]: values for values in found.values()}
    assert "prterun" in by_host[hosts[0]]["ancestors"], found  # mpirun in the batch script
    assert _under_srun_daemon(by_host[hosts[1]]["ancestors"]), found
    for values in found.values():
        # the settings reach the rank on the other host too (mpirun -x through its daemon)
        assert values["omp_threads"] == "1" and values["timeout_seconds"] == 123.0, values
        assert values["weights_changed"] and values["serial_difference"] < 1e-5, values
    assert len({values["weights_sha256"] for values in found.values()}) == 1, found
    assert _job_leftovers(slurm_on_hosts) == {}


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_salloc_from_the_login_node_places_a_rank_on_each_host(slurm_on_hosts):
    """salloc runs the launcher in the root namespace (the login node): mpirun there
    starts its daemons on both nodes through srun."""
    hosts = slurm_on_hosts.hosts.hosts
    done = slurm_on_hosts.run(
        ["salloc", "-N", "2", "-n", "2", "--time=3", *LAUNCHER, "--output-on-all-devices",
         "--", PROGRAM, "layout-only"], timeout=180, cwd=REPO_ROOT, env={"PYTHONPATH": REPO_ROOT})
    assert done.returncode == 0, done.stdout + done.stderr
    found = rank_results(done.stdout)
    _check_one_rank_per_host(found, hosts, done.stdout + done.stderr)
    assert all(_under_srun_daemon(values["ancestors"]) for values in found.values()), found
    assert _job_leftovers(slurm_on_hosts) == {}


@pytest.mark.multirank
@pytest.mark.timeout(200)
def test_a_failing_rank_ends_the_two_node_job_naming_rank_and_host(slurm_on_hosts, tmp_path):
    hosts = slurm_on_hosts.hosts.hosts
    script, out = tmp_path / "fail.py", tmp_path / "job.out"
    script.write_text(FAIL_RANK_1)
    start = time.monotonic()
    done = slurm_on_hosts.batch(
        ["-N", "2", "-n", "2", "--time=3", "-o", str(out), "--wrap",
         f"{JOB_ENV} {shlex.join([*LAUNCHER, '--', str(script)])}"], timeout=180)
    text = out.read_text() if out.exists() else ""
    assert done.returncode == 3, done.stderr + text          # the job's exit code: rank 1's
    assert time.monotonic() - start < 90, text
    gave_up = re.search(r"rank 1 gives up on (\S+)", text)
    assert gave_up and gave_up.group(1) in hosts, text
    assert ("tarantella: error: rank 1 of 2 failed first: it exited with code 3 on host "
            f"{gave_up.group(1)}") in text, text
    assert _job_leftovers(slurm_on_hosts) == {}


@pytest.mark.multirank
@pytest.mark.timeout(400)
def test_an_elastic_no_kill_job_that_loses_a_node_goes_on_with_the_uninterrupted_weights(slurm_on_hosts,
                                                                                          tmp_path):
    """`sbatch --no-kill` and `tarantella --elastic` on two nodes: the second node's link is cut while the job
    trains. The launcher drops its rank and goes on with one rank on the first node, named as the next
    generation's host (the allocation's node list still holds the lost one); Slurm marks the node DOWN and
    removes it from the job while that generation runs (its pause waits for it), and the job goes on. Last in
    this file: the node is down until its link comes back. The weights: the uninterrupted 1-rank run's, bit for
    bit (exact mode, tests/cluster/test_elastic_hosts.py)."""
    hosts = slurm_on_hosts.hosts
    lost = hosts.hosts[1]
    expected = _exact_reference()
    out = tmp_path / "job.out"
    exports = " ".join(f"{name}={value}" for name, value in EXACT.items())
    command = shlex.join([*LAUNCHER, "--elastic", "--timeout", "10", "--output-on-all-devices", *EXACT_ARGS, "--",
                          ELASTIC_FIT, "--state", str(tmp_path), "--fault", "1:0:6:pause", "--fault",
                          "2:0:10:pause"])
    submitted = slurm_on_hosts.submit(["-N", "2", "-n", "2", "-c", "1", "--no-kill", "--time=10", "-o", str(out),
                                       "--wrap", f"{JOB_ENV} export {exports} && {command}"])
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]

    def text() -> str:
        return out.read_text(errors="replace") if out.exists() else ""

    def wait_for(path, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not path.exists() and time.monotonic() < deadline and slurm_on_hosts.job_fields(job).get(
                "JobState") in ("PENDING", "RUNNING"):
            time.sleep(0.2)
        assert path.exists(), f"no {path.name}; the job: {slurm_on_hosts.job_fields(job)}\n{text()}"
    try:
        wait_for(tmp_path / "paused-1", 200)
        hosts.cut_link(lost)
        cut_at = time.time()
        (tmp_path / "go-1").touch()
        wait_for(tmp_path / "paused-2", 120)
        deadline = time.monotonic() + 60
        while not slurm_on_hosts.node_states().get(lost, "").startswith("down") and time.monotonic() < deadline:
            time.sleep(0.5)
        states = slurm_on_hosts.node_states()
        (tmp_path / "go-2").touch()
        code = slurm_on_hosts.wait(job, 120)
        fields = slurm_on_hosts.job_fields(job)
    finally:
        hosts.restore_link(lost)
    described = f"exit {code}, job {fields}, nodes {states}\n{text()}"
    assert states[lost].startswith("down"), described       # Slurm found the node gone while the job ran ...
    assert code == 0 and fields["JobState"] == "COMPLETED", described
    assert fields["NodeList"] == hosts.hosts[0], described   # ... and took it out of the job, which went on
    assert re.search(rf"tarantella: elastic: lost rank 1 \(host {lost}\) sent nothing: its host or the host's "
                     rf"network is gone; generation 2 goes on with 1 rank\(s\) on {hosts.hosts[0]}:1", text()), \
        described
    [result] = _lines(text(), "RESULT")
    assert (result["generation"], result["size"]) == (2, 1), described
    assert result["weights_sha256"] == expected["weights_sha256"], described
    [resumed] = _lines(text(), "RESUMED")
    print(f"a node's link cut under Slurm: recovered {resumed['time'] - cut_at:.1f} s after the cut (timeout 10 s), "
          f"from step {resumed['from_step']} (the cut was at step 6)")
    assert not [entry for entry in hosts.shm_entries(hosts.hosts[0]) if entry.startswith("tnt-elastic-")]
