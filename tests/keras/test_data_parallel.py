"""tnt.Model on 1..4 ranks against plain serial Keras (programs/*.py run every check in one launch)."""
import json
import os

import pytest

from tests.launches import TRAINING
from tests.multirank import run_ranks

PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")
TOLERANCE = 1e-5  # relative, see relative_difference in programs/fit_matches_serial.py
TIMEOUT = 400
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def results(run, n):
    """{check: {rank: values}} from the ranks' RESULT lines."""
    by_check = {}
    for rank, text in run.rank_stdout.items():
        for line in text.splitlines():
            if line.startswith("RESULT "):
                values = json.loads(line[len("RESULT "):])
                assert values["rank"] == rank and values["size"] == n
                by_check.setdefault(values["check"], {})[rank] = values
    for check, per_rank in by_check.items():
        assert sorted(per_rank) == list(range(n)), f"{check}: results from ranks {sorted(per_rank)}"
    return by_check


@TRAINING.test("fit_matches_serial")
@pytest.mark.parametrize("n", [1, 2, 3, pytest.param(4, marks=pytest.mark.extended)])
def test_fit_evaluate_predict_match_serial_keras(n):
    run = TRAINING.run("fit_matches_serial", n).check()
    found = results(run, n)
    for check in ("mlp_arrays", "cnn_dataset", "mlp_micro_batches", "dict_inputs", "compiled_before_wrapping",
                  "subclassed_unbuilt"):
        for rank, values in found[check].items():
            assert values["weights"] <= TOLERANCE, f"{check} rank {rank}: weights differ by {values['weights']}"
            assert values["history"] <= TOLERANCE, f"{check} rank {rank}: logs differ by {values['history']}"
            assert values["epochs"] == 3
            assert check in ("compiled_before_wrapping", "subclassed_unbuilt") or "val_loss" in values["history_keys"]
        # Logs are global values: bitwise the same on every rank.
        assert len({json.dumps(v["logs"], sort_keys=True) for v in found[check].values()}) == 1, check
        print(f"{n} ranks, {check}: max relative difference weights "
              f"{max(v['weights'] for v in found[check].values()):.2e}, "
              f"logs {max(v['history'] for v in found[check].values()):.2e}")
    for values in found["mlp_evaluate"].values():
        assert values["distributed"] == pytest.approx(values["serial"], rel=TOLERANCE)
    for values in found["mlp_predict"].values():
        assert values["shape"] == [103, 3] and values["difference"] < 1e-5
    for values in found["batch_norm"].values():
        # BatchNorm uses the global batch's statistics (Note [BatchNormalization over the global batch]):
        # serial training at every rank count, moving statistics equal on every rank.
        assert values["trainable_equal_on_ranks"] and values["moving_stats_equal_on_ranks"]
        assert values["weights"] <= TOLERANCE
    assert all(v["every_epoch_a_permutation"] for v in found["shuffle"].values())
    assert all(v["equal_to_master"] for v in found["initial_weights"].values())
    if n > 1:
        assert all(v["raised"] and "GLOBAL" in v["message"] for v in found["small_batch"].values())


def results_from_files(directory, n):
    by_check = {}
    for rank in range(n):
        with open(os.path.join(directory, f"results-{rank}.json")) as handle:
            for line in handle:
                values = json.loads(line)
                by_check.setdefault(values["check"], {})[rank] = values
    return by_check


@pytest.mark.multirank
@pytest.mark.timeout(TIMEOUT + 30)
@pytest.mark.parametrize("n,output_on_all_devices", [(3, False), (2, True)])
def test_callbacks_and_saving(n, output_on_all_devices, tmp_path):
    run_ranks(n, os.path.join(PROGRAMS, "callbacks_and_saving.py"), args=[str(tmp_path)], timeout=TIMEOUT,
              env=ENV, all_output=output_on_all_devices).check()
    found = results_from_files(tmp_path, n)
    callbacks = found["callbacks"]
    # EarlyStopping & co decide identically everywhere: same epochs, same logs, same learning rate.
    assert len({(v["epochs"], json.dumps(v["recorded"]), v["learning_rate"]) for v in callbacks.values()}) == 1
    assert callbacks[0]["epochs"] < 30
    assert all(v["batches"] == callbacks[0]["epochs"] * 8 for v in callbacks.values())  # ceil(90 / 12) steps
    # Output callbacks (files, progress bar) on the master only, unless --output-on-all-devices.
    files = set(os.listdir(tmp_path))
    writers = range(n) if output_on_all_devices else [0]
    for rank in range(n):
        wrote = {f"log-from-rank-{rank}.csv", f"checkpoint-from-rank-{rank}.keras"} <= files
        assert wrote == (rank in writers), f"rank {rank}: {sorted(files)}"
        assert (callbacks[rank]["verbose"] != 0) == (rank in writers)
    assert "model.keras" in files
    for values in found["plain_keras_load"].values():
        assert not values["is_tnt"] and values["same_weights"] and values["same_predictions"]
    for values in found["tnt_load"].values():
        assert values["is_tnt"] and values["weights_equal_on_ranks"]
        assert values["before"] == values["original"]  # the loaded model is the saved one
