"""Each rank: every model of zoo/ (written after keras.io's examples) trained serially by plain Keras in
this process and with the two-line change (`model = tnt.Model(model)`), compared element by element: every
variable of the model (weights, BatchNormalization's moving statistics, optimizer-free state such as seed
generators and metric trackers) and every value of the history. Prints
"RESULT <example> <largest relative difference> <ranks' variables identical>", one line each; an example
that raises prints "RESULT <example> error <False>" and its traceback, and the run goes on.
Arguments: [--floatx float32|float64] and the examples to run (default all).

The test runs float64: Adam-family optimizers turn the rounding noise of a gradient that is zero in exact
arithmetic (a bias before BatchNormalization, an attention key's bias) into steps of the learning rate's
size, so in float32 those variables differ by ~1e-4 from serial while every loss agrees to 1e-7; in
float64 that noise stays ~1e-12, and any real difference (a sample order, a dropout mask, a batch
statistic) stands out by orders of magnitude."""
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
import numpy as np  # noqa: E402

import tarantella as tnt  # noqa: E402
from serial_comparison import elementwise_difference, identical_on_ranks  # noqa: E402
from zoo import EXAMPLES  # noqa: E402


def train(example, wrap):
    keras.utils.set_random_seed(11)
    model, history = example(wrap)
    inner = getattr(model, "wrapped_model", model)
    return [np.asarray(v.numpy()) for v in inner.variables], history.history


arguments = sys.argv[1:]
if arguments[:1] == ["--floatx"]:
    keras.config.set_floatx(arguments[1])
    arguments = arguments[2:]
for name in arguments or list(EXAMPLES):
    try:
        serial_variables, serial_history = train(EXAMPLES[name], lambda model: model)
        variables, history = train(EXAMPLES[name], tnt.Model)
        assert sorted(history) == sorted(serial_history), (sorted(history), sorted(serial_history))
        keys = sorted(history)
        found = max(elementwise_difference(variables, serial_variables),
                    elementwise_difference([history[k] for k in keys], [serial_history[k] for k in keys]))
        print(f"RESULT {name} {found:.3e} {identical_on_ranks(variables)}", flush=True)
    except Exception:  # noqa: BLE001 - one example's failure is its result; the others still run
        traceback.print_exc()
        print(f"RESULT {name} error False", flush=True)
