"""Issue 22 §2: fifteen models written after keras.io's examples (programs/zoo/) train under tnt.Model at 2
ranks as plain Keras trains them serially, element by element: every variable and every value of the history,
with BatchNormalization, Dropout, augmentation layers and users' own steps, losses and metrics. In float64
(programs/keras_io_zoo.py says why), where serial-equal training differs by rounding only (< 1e-8 here) and
any real difference (a sample order, a random draw, a batch statistic) by far more than 1e-7. One launch."""


from tests.launches import TRAINING

TOLERANCE = 1e-7
EXAMPLES = ["dcgan", "vae", "denoising_autoencoder", "simsiam", "distiller", "siamese", "vit", "mlp_mixer", "unet",
            "bidirectional_lstm", "transformer_classifier", "structured_data", "timeseries_conv1d", "multi_output",
            "add_loss_and_trackers"]


@TRAINING.test("keras_io_zoo")
def test_keras_io_examples_train_as_serial_at_two_ranks():
    run = TRAINING.run("keras_io_zoo", 2).check()   # --floatx float64
    for rank in range(2):
        found = {}
        for line in run.rank_stdout[rank].splitlines():
            if line.startswith("RESULT "):
                _, name, difference, identical = line.split()
                found[name] = (difference, identical == "True")
        assert sorted(found) == sorted(EXAMPLES), (rank, run.stdout[-3000:], run.stderr[-3000:])
        failed = {name: result for name, result in found.items()
                  if result[0] == "error" or float(result[0]) > TOLERANCE or not result[1]}
        assert not failed, (rank, failed, run.stderr[-4000:])
