"""Bad input for a multi-host launch, on a namespace cluster: one line naming what is
wrong, exit code 2, within 30 s, nothing left running anywhere."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.multirank import REPO_ROOT

LIMIT_SECONDS = 30.0


def _launch(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "tarantella.launcher", *argv, "--", "-c",
                           "print('ran')"], capture_output=True, text=True,
                          timeout=LIMIT_SECONDS + 30, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": REPO_ROOT})
    return done, time.monotonic() - start


def _processes_mentioning(word: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                text = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if word in text and pid != str(os.getpid()):
            found.append(f"{pid}: {text[:160]}")
    return found


def _cases(cluster, tmp_path) -> dict[str, tuple[list[str], str]]:
    """case: (launcher arguments, what the error line must name)."""
    h0, h1 = cluster.hosts
    unknown = tmp_path / "unknown"
    unknown.write_text(f"{h0}\nnode-that-does-not-exist\n")
    agent, subnet = cluster.agent, cluster.subnet
    failing_agent = tmp_path / "failing-agent"
    failing_agent.write_text("#!/bin/sh\necho 'agent: permission denied (publickey)' >&2\nexit 255\n")
    failing_agent.chmod(0o755)
    hanging_agent = tmp_path / "hanging-agent"
    hanging_agent.write_text("#!/bin/sh\nexec sleep 600  # a host that never answers\n")
    hanging_agent.chmod(0o755)
    return {
        "agent that never returns": (
            ["--hostfile", cluster.hostfile, "--launch-agent", str(hanging_agent),
             "--network-interface", subnet, "--launch-timeout", "5"],
            f"host {h0}, {h1}: 2 of 2 rank(s) had not started after 5 s"),
        "unknown host in hostfile": (
            ["--hostfile", str(unknown), "--launch-agent", agent, "--network-interface", subnet],
            "host node-that-does-not-exist"),
        "unreachable host (link down)": (
            ["--hostfile", cluster.hostfile, "--launch-agent", agent, "--network-interface",
             subnet], f"host {h1}"),
        "failing agent": (
            ["-H", f"{h0},{h1}", "--launch-agent", str(failing_agent), "--network-interface",
             subnet], str(failing_agent)),
        "nonexistent interface": (
            ["--hostfile", cluster.hostfile, "--launch-agent", agent, "--network-interface",
             "tntnosuch0"], "'tntnosuch0'"),
        "subnet of no interface": (
            ["--hostfile", cluster.hostfile, "--launch-agent", agent, "--network-interface",
             "10.254.254.0/24"], "10.254.254.0/24"),
        "-H with a bad count": (
            ["-H", f"{h0}:2,{h1}:zero", "--launch-agent", agent], "'zero'"),
        "-H with a zero count": (
            ["-H", f"{h0}:0,{h1}:1", "--launch-agent", agent], f"{h0!r}"),
    }


@pytest.mark.multirank
@pytest.mark.timeout(8 * (LIMIT_SECONDS + 40))
def test_bad_multi_host_input_is_one_line_and_exit_2(netns_cluster, tmp_path):
    cluster = netns_cluster(hosts=2, slots=1)
    failures = []
    for case, (argv, named) in _cases(cluster, tmp_path).items():
        if case.startswith("unreachable"):
            cluster.cut_link(cluster.hosts[1])
        try:
            done, seconds = _launch(argv)
        finally:
            if case.startswith("unreachable"):
                cluster.restore_link(cluster.hosts[1])
        lines = done.stderr.splitlines()
        left = cluster.wait_until_clean(5)
        stray = _processes_mentioning(cluster.name)
        print(f"{case}: exit {done.returncode} after {seconds:.1f} s: {done.stderr.strip()}")
        if not (done.returncode == 2 and len(lines) == 1 and lines[0].startswith(
                "tarantella: error: ") and named in lines[0] and done.stdout == ""
                and seconds < LIMIT_SECONDS and not left and not stray):
            failures.append(f"{case}: exit {done.returncode} after {seconds:.1f} s, expected a "
                            f"line naming {named!r}; left {left} {stray}\nstdout: {done.stdout}"
                            f"\nstderr: {done.stderr}")
    assert not failures, "\n\n".join(failures)
