"""Models with their own training logic, custom loops and Keras fidelity on 1 and 2 ranks, against serial
Keras in the same program (programs/own_training_logic.py, programs/keras_fidelity.py, examples/custom_loop.py)."""
import os
import re

import pytest

from tests.launches import TRAINING
from tests.keras.test_data_parallel import ENV, PROGRAMS, results
from tests.multirank import run_ranks

TOLERANCE = 1e-5
TIMEOUT = 400


@TRAINING.test("own_training_logic")
@pytest.mark.parametrize("n", [1, 2])
def test_overridden_steps_and_gan_match_serial(n):
    run = TRAINING.run("own_training_logic", n).check()
    found = results(run, n)
    for check in ("compute_loss", "train_test_predict_steps", "gan"):
        for rank, values in found[check].items():
            assert values["weights"] <= TOLERANCE, f"{check} rank {rank}: weights differ by {values['weights']}"
            assert values["logs"] <= TOLERANCE, f"{check} rank {rank}: logs differ by {values['logs']}"
        assert len({str(v["all_logs"]) for v in found[check].values()}) == 1, f"{check}: logs differ between ranks"
    for check in ("compute_loss", "train_test_predict_steps"):
        for values in found[check].values():
            assert values["evaluate"] <= TOLERANCE and values["predict"] <= TOLERANCE
            assert values["predict_shape"] == [101, 3]
    assert sorted(found["gan"][0]["keys"]) == ["d_loss", "g_loss"]
    # A step's own loss beside other values is what the history holds (never the untouched loss tracker's 0.0),
    # and a float64 model's logs are its float64 values, not float32 sums (issue 44 §2).
    for kind in ("arrays", "dataset"):
        for dtype, tolerance in (("float32", TOLERANCE), ("float64", 1e-12)):
            check = f"own_loss_beside_others_{kind}_{dtype}"
            for rank, values in found[check].items():
                assert values["keys"] == ["loss", "out"], (check, values)
                assert min(values["all_logs"]["loss"]) > 0.01, (check, rank, values["all_logs"])
                assert values["weights"] <= tolerance, f"{check} rank {rank}: weights differ by {values['weights']}"
                assert values["logs"] <= tolerance, (check, rank, values["all_logs"], values["serial_logs"])
    # keras.io's VAE, as written and with a call(): its Sampling draws serial's values (issue 44 §3); bit for bit
    # at one rank, where nothing is summed.
    for check in ("vae_VAE", "vae_CallableVAE"):
        for rank, values in found[check].items():
            assert values["count"] == 15, (check, values)  # weights, seed state, optimizer-free trackers
            assert values["variables"] <= (0.0 if n == 1 else 1e-12), f"{check} rank {rank}: {values}"
            assert values["logs"] <= 1e-12, f"{check} rank {rank}: {values}"
    for values in found["manual_update"].values():  # refused at every rank count, in one line
        assert values["raised"] and "optimizer.apply" in values["message"], values


@TRAINING.test("keras_fidelity")
@pytest.mark.parametrize("n", [2])  # 2 ranks: the data sets end with 1-sample batches (an empty micro-batch)
def test_keras_io_architectures_empty_micro_batches_class_weight(n):
    run = TRAINING.run("keras_fidelity", n).check()
    found = results(run, n)
    for check in ("text_transformer", "images_lenet", "images_batch_norm", "tabular", "class_weight_dataset"):
        for rank, values in found[check].items():
            assert values["finite"] and values["equal_on_ranks"], (check, rank, values)
            assert values["predict_rows"] > 0
            if values["serial_equal"]:
                for key in ("weights", "logs", "evaluate", "predict"):
                    assert values[key] <= TOLERANCE, f"{check} rank {rank}: {key} differs by {values[key]}"
    assert all(v["finite"] and v["count"] == 2 for v in found["batch_norm_moving_stats"].values())
    for values in found["refusals"].values():
        assert set(values["messages"]) == {"jit_compile", "class_weight_outputs", "loss_reduction"}, values
        assert values["lines"]["jit_compile"] == 1 and values["lines"]["loss_reduction"] == 1
        assert "single output" in values["messages"]["class_weight_outputs"]


@TRAINING.test("sparse_optimizers")
def test_sparse_gradients_with_adam_rmsprop_adagrad_match_serial():
    """Embeddings' gradients are slices per lookup, applied slice by slice by these optimizers: 2 ranks
    must equal serial in fit, an own train_step and a custom loop (Note [Sparse gradients stay sparse])."""
    run = TRAINING.run("sparse_optimizers", 2).check()
    found = results(run, 2)
    assert sorted(found) == ["custom_loop_adam", "fit_adagrad", "fit_adam", "fit_rmsprop", "own_train_step_adam"]
    for check, per_rank in found.items():
        for rank, values in per_rank.items():
            assert values["finite"], (check, rank)
            assert values["weights"] <= TOLERANCE, f"{check} rank {rank}: weights differ by {values['weights']}"
            assert values["logs"] <= TOLERANCE, f"{check} rank {rank}: logs differ by {values['logs']}"


@TRAINING.test("custom_loop")
@pytest.mark.parametrize("n", [1, 2])
def test_custom_loop_example_matches_serial(n):
    run = TRAINING.run("custom_loop", n).check()
    for rank in range(n):
        match = re.search(r"max relative difference (\S+)", run.rank_stdout[rank])
        assert match and float(match.group(1)) <= TOLERANCE, run.rank_stdout[rank]


@pytest.mark.multirank
@pytest.mark.timeout(400)
@pytest.mark.parametrize("n, shard, own_step", [(2, "off", False), (3, "optimizer", False), (2, "weights", False),
                                                (2, "gradients", True),
                                                # the extended tier: Note [The suite's two tiers] in tests/conftest.py
                                                *(pytest.param(*case, marks=pytest.mark.extended) for case in
                                                  [(1, "off", False), (2, "gradients", False), (2, "weights", True)])])
def test_backup_and_restore_resume_is_bitwise_equal(n, shard, own_step, tmp_path):
    """The same command twice: the first run is killed (os._exit on every rank) in epoch 3, the second
    resumes from the master's backup and must end with the uninterrupted run's weights, bit for bit; also with
    the optimizer state sharded (each rank's share comes back from the master's backup), and for a model with
    its own train_step."""
    program = os.path.join(PROGRAMS, "resume.py")
    env = dict(ENV, SHARD=shard, **({"OWN_STEP": "1"} if own_step else {}))
    killed = run_ranks(n, program, args=[str(tmp_path)], timeout=180, env=env)
    assert killed.returncode != 0, killed.describe()
    assert sorted(os.listdir(tmp_path / "backup")) == ["latest.weights.h5", "training_metadata.json"]
    found = results(run_ranks(n, program, args=[str(tmp_path)], timeout=180, env=env).check(), n)
    for values in found["resume"].values():
        assert values["resumed"] and values["epochs_run"] == 2 and values["bitwise_equal"], values
    assert not (tmp_path / "backup").exists()  # deleted at the end, by the master
