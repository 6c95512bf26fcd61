"""Device selection per rank (this machine has no GPU: the logic is tested on its inputs)."""
import pytest

from tarantella import devices


def test_local_rank_from_the_launchers_variables():
    assert devices.local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}) == 3
    assert devices.local_rank({"SLURM_LOCALID": "1"}) == 1
    assert devices.local_rank({}) is None


@pytest.mark.parametrize("local_rank,expected", [(0, "0"), (1, "1"), (3, "3"), (4, "0"), (5, "1")])
def test_each_rank_gets_the_gpu_at_its_local_rank(local_rank, expected):
    environ = {"OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank)}
    assert devices.environment_for_rank(environ, ["0", "1", "2", "3"], no_gpu=False) == {
        "CUDA_VISIBLE_DEVICES": expected, "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def test_a_preset_device_list_is_respected():
    environ = {"CUDA_VISIBLE_DEVICES": "4,6", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    gpus = devices.detected_gpus(environ)
    assert gpus == ["4", "6"]
    assert devices.environment_for_rank(environ, gpus, no_gpu=False)["CUDA_VISIBLE_DEVICES"] == "6"


def test_no_gpu_hides_every_gpu():
    environ = {"OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    assert devices.environment_for_rank(environ, ["0", "1"], no_gpu=True) == {"CUDA_VISIBLE_DEVICES": "-1"}
    assert devices.detected_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_without_gpus_or_launcher_nothing_changes(tmp_path):
    assert devices.detected_gpus({}, driver_dir=str(tmp_path / "absent")) == []
    assert devices.environment_for_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "0"}, [], no_gpu=False) == {}
    assert devices.environment_for_rank({}, ["0", "1"], no_gpu=False) == {}


def test_gpus_listed_by_the_driver(tmp_path):
    for bus_id in ("0000:3b:00.0", "0000:af:00.0"):
        (tmp_path / bus_id).mkdir()
    assert devices.detected_gpus({}, driver_dir=str(tmp_path)) == ["0", "1"]


def test_configure_environment_reads_the_no_gpu_setting():
    environ = {"TNT_NO_GPU": "1"}
    assert devices.configure_environment(environ) == {"CUDA_VISIBLE_DEVICES": "-1"}
    assert environ["CUDA_VISIBLE_DEVICES"] == "-1"
