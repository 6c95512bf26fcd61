"""Device counts beyond what the machine or the hostfile provides are refused before running."""
import pytest

from bench.errors import BenchUsageError
from bench.sweep.capacity import check_counts, find_capacity

pytestmark = pytest.mark.timeout(20)


def test_hostfile_slots_and_npernode(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node1 slots=2\nnode2:3\n")
    assert find_capacity(str(hostfile), None).devices == 5
    assert find_capacity(str(hostfile), 4).devices == 8
    with pytest.raises(BenchUsageError, match=r"hostfile .* provides 5"):
        check_counts([1, 2, 4, 8], find_capacity(str(hostfile), None), oversubscribe=True)


def test_this_machine_allows_oversubscription_only_when_asked():
    capacity = find_capacity(None, None)
    beyond = [capacity.devices * 2]
    with pytest.raises(BenchUsageError, match="--oversubscribe"):
        check_counts(beyond, capacity, oversubscribe=False)
    check_counts(beyond, capacity, oversubscribe=True)


def test_bad_hostfile_is_a_usage_error(run_cli, tmp_path):
    code, _, err = run_cli("scaling", "--model", "resnet_tiny", "--hostfile", str(tmp_path / "missing"),
                           "--out", str(tmp_path / "o"))
    assert code == 2 and "does not exist" in err
