"""Every input kind on 1 and 2 ranks through the launcher (programs/input_kinds.py runs all checks in one launch):
training equal to serial Keras, each rank's pipeline mapping about 1/N of the samples, the order-mismatch errors."""

import pytest

from tests.keras.test_data_parallel import results  # {check: {rank: values}} from RESULT lines
from tests.launches import TRAINING

TOLERANCE = 1e-5  # as tests/keras/test_data_parallel.py
N, BATCH, EPOCHS = 96, 12, 2  # as in the program


def shares(batches: int, n: int, rank: int) -> int:
    """Batches rank `rank` reads of an epoch of `batches`: kN+rank of each group of n."""
    return len(range(rank, batches, n))


@TRAINING.test("input_kinds")
@pytest.mark.parametrize("n", [1, 2])
def test_every_input_kind_reads_its_share_and_trains_as_serial(n):
    run = TRAINING.run("input_kinds", n).check()
    found = results(run, n)
    for values in found["alltoall"].values():
        assert values["exact"] == [True] * n and "give one block (possibly empty) per rank" in values["refused"]
    for check in ("batched_dataset", "unbatched_micro_batches"):
        for rank, values in found[check].items():
            assert values["weights"] <= TOLERANCE, (check, rank, values)
            # Serial maps every sample each epoch (plus what Keras pulls to build); a rank maps its share.
            assert values["rank_maps"] <= values["serial_maps"] / n + 2 * BATCH, (check, rank, values)
            assert values["serial_maps"] >= EPOCHS * N
    for rank, values in found["batched_dataset"].items():
        assert values["batches_match"]
        assert values["stream_maps"] == N // n  # exactly this rank's samples, once
        assert values["evaluate"] == pytest.approx(values["serial_evaluate"], rel=TOLERANCE)
        assert values["predict"] < 1e-5
    # A PyDataset: rank r reads batch kN+r of each group of N (the master also peeks at one batch, once).
    batches = N // BATCH
    for rank, values in found["py_dataset"].items():
        assert values["weights"] <= TOLERANCE
        assert values["calls"] == EPOCHS * shares(batches, n, rank) + (rank == 0), (rank, values)
    for rank, values in found["py_dataset_own_shuffle"].items():  # 9 batches, the last of 1 sample
        assert values["weights"] <= TOLERANCE and values["all_once"], (rank, values)
        assert values["calls"] == EPOCHS * shares(9, n, rank) + (rank == 0), (rank, values)
        assert values["ended"] == EPOCHS + 1, values  # as Keras: once before the first epoch, then after each
        assert values["evaluate"] == pytest.approx(values["serial_evaluate"], rel=TOLERANCE)
        assert values["predict"] < 1e-5
    for rank, values in found["py_dataset_partial_passes"].items():  # 6 of 8 batches used: groups 0..2 read
        assert values["finished"] and (values["calls"] == shares(6, n, rank) + (rank == 0) or n == 1), values
    for kind in ("threads", "processes"):  # fetched by the workers (one call in the master's main thread: the peek)
        for rank, values in found["py_dataset_" + kind].items():
            assert values["weights"] <= TOLERANCE, values
            assert values["calls"] == EPOCHS * shares(batches, n, rank) + (rank == 0), (rank, values)
            assert values["main_thread_calls" if kind == "threads" else "main_process_calls"] == (rank == 0), values
    for values in found["generator"].values():
        assert values["weights"] <= TOLERANCE
    for values in found["from_function"].values():
        assert values["samples"] == N // n and values["all_once"] and values["loss_finite"]
    if n > 1:
        for kind in ("order_mismatch_per_rank_seed", "order_mismatch_per_rank_batch_shuffle",
                     "order_mismatch_last_batch_differs", "order_mismatch_per_rank_generator"):
            for values in found[kind].values():
                assert values["raised"] and "same seed on all ranks" in values["message"], (kind, values)
        for values in found["order_mismatch_py_dataset_global_random"].values():
            assert values["raised"] and "global random generator" in values["message"], values
        for values in found["unseeded_shuffle"].values():
            assert values["raised"] and "unseeded Dataset.shuffle()" in values["message"]
    # One warning line, on the master only, for the PyDataset and the generator inputs.
    warned = [rank for rank, text in run.rank_stderr.items() if "yields whole global batches" in text]
    assert warned == [0] or n == 1
