"""`tnt-bench scaling` across 4 namespace hosts of 1 rank, started the way the namespace
validation is measured (results/validation/README.md: `python -m bench.cluster run
--hosts 4 ... tnt-bench scaling $NETNS_CLUSTER_ARGS`), on the tiny ResNet: every
rank on a host of its own, the rows and the validation against the netns_cluster
profile written, and the cluster gone afterwards. No timing is asserted."""
from __future__ import annotations

import re
import subprocess
import sys

import pandas as pd
import pytest

from tests.cluster.netns_fixture import skip_reason
from tests.multirank import REPO_ROOT

# $0 is the interpreter; NETNS_CLUSTER_ARGS: the cluster's launcher options
SWEEP = ('exec "$0" -m bench scaling --model resnet_tiny --micro-batch 8 --devices 1,4 '
         '--steps 2 --warmup-steps 1 $NETNS_CLUSTER_ARGS --no-plots --quiet --out "$1"')


def _namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


@pytest.mark.multirank
@pytest.mark.extended   # on one host: tests/bench/test_scaling_sweep.py (tests/conftest.py: the tiers)
@pytest.mark.timeout(300)
def test_scaling_sweep_runs_on_four_hosts_and_validates(tmp_path):
    reason = skip_reason()
    if reason:
        pytest.skip(f"no namespace cluster: {reason}")
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "bench.cluster", "run", "--hosts", "4", "--slots",
                           "1", "--", "sh", "-c", SWEEP, sys.executable, str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    cluster = re.search(r"^netns cluster (\S+): 4 hosts", done.stderr, re.MULTILINE)
    assert cluster, done.stderr[-3000:]
    assert not [ns for ns in _namespaces() if ns.startswith(cluster.group(1))]  # removed

    runs = pd.read_csv(out / "runs.csv")
    assert list(runs["devices"]) == [1, 4] and not runs["simulated"].any()
    assert list(runs["nodes"]) == [1, 4]          # one rank per host
    assert runs["command"].str.contains("--launch-agent").all()
    assert runs["load_average_1m"].notna().all()  # the load is recorded with every figure

    validate = subprocess.run([sys.executable, "-m", "bench", "validate", str(out), "--cluster",
                               "netns_cluster"], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=120)
    assert validate.returncode == 0, validate.stderr[-3000:]
    validation = pd.read_csv(out / "validation.csv")
    assert list(validation["devices"]) == [1, 4]
    assert list(validation["role"]) == ["calibration", "prediction"]
    assert validation["relative_error"].notna().all()
    assert (validation["cluster"] == "netns-cluster").all()
