"""`tarantella --elastic` across the hosts of a namespace cluster: a job of 2 hosts x 2 ranks loses a host (its
link cut), then a rank (SIGKILL); a sharded job of 4 hosts x 1 loses a rank in its commit, then another; one of 3
loses a hung rank (SIGSTOP) and grows to 4 when a host is added. Each ends with the weights of an uninterrupted 1-rank
run, bit for bit (exact mode: 4 virtual batches, so 4, 3, 2 and 1 ranks add alike)."""
from __future__ import annotations

import functools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.multirank import REPO_ROOT, launch_environment, run_ranks

PROGRAM = os.path.join(REPO_ROOT, "tests", "elastic", "programs", "elastic_fit.py")
EXACT = {"TNT_EXACT_VIRTUAL_BATCHES": "4", "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}
EXACT_ARGS = ["--allreduce-algorithm", "recursive_doubling"]
TIMEOUT = 10


def _lines(text: str, kind: str) -> list[dict]:
    return [json.loads(line.split(f"{kind} ", 1)[1]) for line in text.splitlines() if f"] {kind} " in line]


@functools.lru_cache(maxsize=None)
def _exact_reference() -> dict:
    """The uninterrupted 1-rank run in exact mode, 4 virtual batches."""
    return _lines(run_ranks(1, PROGRAM, launcher_args=EXACT_ARGS, env=EXACT, timeout=120).check().stdout,
                  "RESULT")[0]


def _wait_for(path: str, process: subprocess.Popen, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and process.poll() is None:
        if os.path.exists(path):
            return True
        time.sleep(0.05)
    return False


def _run_with_fault(command, env, state, generation: int, make_fault, undo=lambda: None, release_when=None):
    """Runs the elastic job; when its rank pauses in `generation` (the program's pause fault), calls
    make_fault() (returns the fault's time) and, once the launcher's stderr so far matches `release_when` (if
    given), lets the rank go on. (stdout, stderr, description, fault time)."""
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=env, text=True, errors="replace", start_new_session=True)
    output = {"out": [], "err": []}
    arrived = []   # (time, the launcher's line): where a recovery's seconds go

    def read(name, pipe):
        for line in iter(pipe.readline, ""):
            output[name].append(line)
            if line.startswith("tarantella:") or "] tarantella: elastic" in line:
                arrived.append((time.time(), line))
    readers = [threading.Thread(target=read, args=(name, pipe), daemon=True)
               for name, pipe in (("out", process.stdout), ("err", process.stderr))]
    for reader in readers:
        reader.start()
    fault_at = time.time()
    try:
        assert _wait_for(str(state / f"paused-{generation}"), process, 400), \
            f"generation {generation} did not reach its pause\n{''.join(output['err'])}"
        fault_at = make_fault()
        deadline = time.monotonic() + 60
        while release_when and not re.search(release_when, "".join(output["err"])) and time.monotonic() < deadline:
            time.sleep(0.1)
        (state / f"go-{generation}").touch()
        process.wait(timeout=400)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        undo()
        for reader in readers:
            reader.join(timeout=10)
    stdout, stderr = "".join(output["out"]), "".join(output["err"])
    # The launcher's own lines first, seconds after the fault: a failure's report is cut short, and the ranks'
    # lines are long.
    launcher = "".join(f"{at - fault_at:+6.1f} s {line}" for at, line in arrived)
    print(launcher)
    described = (f"exit {process.returncode}\n--- the launcher's lines ---\n{launcher}\n--- stdout ---\n{stdout}"
                 f"\n--- stderr ---\n{stderr}")
    assert process.returncode == 0, described
    return stdout, stderr, described, fault_at


@pytest.mark.multirank
@pytest.mark.timeout(900)
def test_a_job_that_loses_a_host_then_a_rank_ends_with_the_uninterrupted_weights(netns_cluster, tmp_path):
    cluster = netns_cluster(hosts=2, slots=2)
    expected = _exact_reference()
    command = [sys.executable, "-m", "tarantella.launcher", "-n", "4", "--output-on-all-devices",
               *cluster.launcher_args(), "--elastic", "--timeout", str(TIMEOUT), *EXACT_ARGS, "--", PROGRAM,
               "--state", str(tmp_path), "--fault", "1:0:6:pause", "--fault", "2:1:14:kill"]
    cut = cluster.hosts[1]
    stdout, stderr, described, cut_at = _run_with_fault(
        command, launch_environment(EXACT), tmp_path, 1, lambda: (cluster.cut_link(cut), time.time())[1],
        undo=lambda: cluster.restore_link(cut))
    [result] = _lines(stdout, "RESULT")
    assert result["generation"] == 3 and result["size"] == 1, described
    assert result["weights_sha256"] == expected["weights_sha256"], described
    assert re.search(rf"lost rank 2 \(host {cut}\) .*rank 3 \(host {cut}\) .*; generation 2 goes on with 2 "
                     rf"rank\(s\) on {cluster.hosts[0]}:2", stderr), described
    assert re.search(r"lost rank 1 \(host \S+\) was killed by SIGKILL .*; generation 3 goes on with 1 rank",
                     stderr), described
    resumed = _lines(stdout, "RESUMED")
    [killed] = _lines(stdout, "FAULT")[-1:]
    print(f"link cut: recovered {resumed[0]['time'] - cut_at:.1f} s after the cut (timeout {TIMEOUT} s), from "
          f"step {resumed[0]['from_step']} (the pause was at step 6); SIGKILL: recovered "
          f"{resumed[1]['time'] - killed['time']:.1f} s after it, {killed['step'] - resumed[1]['from_step']} "
          f"step(s) lost")
    assert not [e for e in cluster.shm_entries(cluster.hosts[0]) if e.startswith("tnt-elastic-")]


@pytest.mark.multirank
@pytest.mark.timeout(900)
def test_a_hung_rank_is_dropped_and_an_added_host_taken_mid_epoch(netns_cluster, tmp_path):
    """4 hosts of 1 rank, the job's hostfile lists 3: rank 2 is stopped (SIGSTOP) past the timeout, the job goes
    on with 2 ranks; then the hostfile gains the fourth host in the middle of an epoch, and the job grows to 4,
    though mpirun fails at start-up once, as it does now and then (the launch agent fails once). 3 -> 2 -> 4
    ranks: the uninterrupted 1-rank run's weights bit for bit."""
    cluster = netns_cluster(hosts=4, slots=1)
    expected = _exact_reference()
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{host}\n" for host in cluster.hosts[:3]))
    args = cluster.launcher_args()
    args[args.index("--hostfile") + 1] = str(hostfile)
    fail_once = tmp_path / "fail-once"
    flaky_agent = tmp_path / "agent"
    flaky_agent.write_text(f'#!/bin/sh\nrm "{fail_once}" 2>/dev/null && exit 1\nexec {cluster.agent} "$@"\n')
    flaky_agent.chmod(0o755)
    args[args.index("--launch-agent") + 1] = str(flaky_agent)
    command = [sys.executable, "-m", "tarantella.launcher", "--output-on-all-devices", *args, "--elastic",
               "--timeout", str(TIMEOUT), "--discovery-interval", "1", *EXACT_ARGS, "--", PROGRAM, "--state",
               str(tmp_path), "--fault", "1:2:5:stop", "--fault", "2:0:11:pause"]
    env = launch_environment(EXACT)

    def add_host():
        fail_once.touch()   # the next launch is generation 3's
        hostfile.write_text("".join(f"{host}\n" for host in cluster.hosts))
        return time.time()
    # The rank goes on once the launcher saw the new hosts (it reads the hostfile every second) and asked.
    stdout, stderr, described, added_at = _run_with_fault(command, env, tmp_path, 2, add_host,
                                                          release_when=r"the job's hosts are now")
    [result] = _lines(stdout, "RESULT")
    assert result["generation"] == 3 and result["size"] == 4 and result["steps"] == 24, described
    assert re.search(r"lost rank 2 \(host \S+-h2\) was stopped \(SIGSTOP\) for [\d.]+ s and hung; generation 2 "
                     r"goes on with 2 rank", stderr), described
    assert re.search(r"the job's hosts changed; generation 3 goes on with 4 rank\(s\) on " +
                     r", ".join(f"{host}:1" for host in cluster.hosts), stderr), described
    assert re.search(r"generation 3 started no rank \(cannot start the ranks on host .*\); launching it again "
                     r"\(attempt 2 of 3\)", stderr), described
    assert result["weights_sha256"] == expected["weights_sha256"], described
    [stopped] = _lines(stdout, "FAULT")[:1]
    resumed = _lines(stdout, "RESUMED")
    print(f"SIGSTOP: recovered {resumed[0]['time'] - stopped['time']:.1f} s after it (timeout {TIMEOUT} s), "
          f"{stopped['step'] - resumed[0]['from_step']} step(s) lost; host added: training on 4 ranks "
          f"{resumed[1]['time'] - added_at:.1f} s after the hostfile changed, from step {resumed[1]['from_step']}")


@pytest.mark.multirank
@pytest.mark.timeout(900)
def test_a_rank_lost_in_its_commit_then_another_train_the_uninterrupted_weights(netns_cluster):
    """4 hosts of 1 rank, their gradients and optimizer state sharded (ZeRO stage 2: each rank commits its own
    share and keeps a copy of its peer's on the next host, Note [A commit by name]): rank 1 is killed in the
    middle of its commit of step 9 (written, not yet in place). Generation 2 (3 ranks, other owners) starts no
    rank on rank 1's host, so rank 1's share comes from its copy on the next host: of step 9 if the copy was
    written before the MPI ended the job, else of step 8. Then rank 2 is killed at step 15 and generation 3 goes
    on with 2. 4 -> 3 -> 2 ranks: the uninterrupted 1-rank run's weights bit for bit."""
    cluster = netns_cluster(hosts=4, slots=1)
    expected = _exact_reference()
    done = run_ranks(4, PROGRAM, args=["--shard", "gradients", "--fault", "1:1:9:commitkill", "--fault",
                                       "2:2:15:kill"],
                     launcher_args=[*cluster.launcher_args(), "--elastic", "--timeout", str(TIMEOUT), *EXACT_ARGS],
                     env=EXACT, timeout=600).check()
    [result] = _lines(done.stdout, "RESULT")
    assert (result["generation"], result["size"]) == (3, 2), done.describe()
    assert result["weights_sha256"] == expected["weights_sha256"], done.describe()
    restored = [int(step) for step in re.findall(r"go on from the commit of epoch \d+, batch \d+ \(step (\d+),",
                                                 done.stdout)]
    assert restored[0] in (8, 9) and restored[1] == 14, done.describe()
    first_read = re.search(r"\(step \d+, made by 4 ranks\), read on hosts? (.*) in", done.stdout).group(1)
    assert cluster.hosts[2] in first_read.split(", ") and cluster.hosts[1] not in first_read, done.describe()
    assert re.search(rf"lost rank 1 \(host {cluster.hosts[1]}\) was killed by SIGKILL .*; generation 2 goes on "
                     rf"with 3 rank\(s\)", done.stderr), done.describe()
    assert re.search(r"lost rank 2 \(host \S+\) was killed by SIGKILL .*; generation 3 goes on with 2 rank",
                     done.stderr), done.describe()
    faults, resumed = _lines(done.stdout, "FAULT"), _lines(done.stdout, "RESUMED")
    for fault, back in zip(faults, resumed):
        print(f"{fault['how']} of rank {fault['rank']} at step {fault['step']}: recovered "
              f"{back['time'] - fault['time']:.1f} s after it, {fault['step'] - back['from_step']} step(s) lost, "
              f"{back['size']} ranks")
