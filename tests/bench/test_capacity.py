"""Device counts beyond what the machine or the hostfile provides are simulated, not run."""
import pytest

from bench.sweep.capacity import find_capacity, split_counts

pytestmark = pytest.mark.timeout(20)


def test_hostfile_slots_and_npernode(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2:3\n")
    assert find_capacity(str(hostfile), None).devices == 5
    assert find_capacity(str(hostfile), 4).devices == 8
    # --oversubscribe never runs more ranks than a hostfile's slots: they are simulated
    assert split_counts([1, 2, 4, 8], find_capacity(str(hostfile), None), oversubscribe=True) == ([1, 2, 4], [8])


def test_this_machine_runs_beyond_its_cores_only_when_asked():
    capacity = find_capacity(None, None)
    counts = [1, capacity.devices, capacity.devices * 2]
    assert split_counts(counts, capacity, oversubscribe=False) == (counts[:2], counts[2:])
    assert split_counts(counts, capacity, oversubscribe=True) == (counts, [])


def test_bad_hostfile_is_a_usage_error(run_cli, tmp_path):
    code, _, err = run_cli("scaling", "--model", "resnet_tiny", "--hostfile", str(tmp_path / "missing"),
                           "--out", str(tmp_path / "o"))
    assert code == 2 and "does not exist" in err
