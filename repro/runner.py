"""Runs the user's script inside one rank of a `tnt-repro check` run.

    python repro/runner.py train.py [script args]     (on every rank, via the launcher)

Before the script starts, as the harness's environment asks:
  TNT_DETERMINISTIC_SEED=S     tarantella.determinism.set_deterministic(S)
  TNT_REPRO_OPS_ONLY=1         only deterministic ops and thread counts, no seeds
                               (the "as written" runs: the script's own seeding counts)
  TNT_REPRO_RECORD=DIR         the recorder joins the first `fit` (tarantella/_repro/hook.py)
  TNT_REPRO_WRAP=1             the script's keras.Model trains through tnt.Model (repro/wrap.py)
  TNT_EXACT_VIRTUAL_BATCHES=V  (read by tnt.Model itself: exact mode, tarantella/_repro/exact_train_step.py)
  TNT_REPRO_CALIBRATE=reverse  tnt.Model and plain Keras models reverse every (micro-)batch
                               before their step (repro/calibration_step.py)
The script then runs as `__main__` with sys.argv = [script, args...].

Note [Harness-side wiring]
tnt.Model.fit adds tarantella._repro.hook.extra_callbacks() itself. This runner
also wraps keras.Model.fit so that scripts training a plain Keras model (serial
references) are recorded too; a process makes at most one recorder, so the two
never record twice. The wrapper also builds a plain Keras model's optimizer
before its first step is traced, as tnt.Model does (one trace instead of two).
The calibration run's reversed batches exist only here: the runner wraps
tnt.Model.train_step and keras.Model.train_step (a plain Keras script's serial
reference) in the harness's own process.
"""
from __future__ import annotations

import os
import runpy
import sys

from repro import wrap

__all__ = ["main"]


def wrap_keras_fit(record: bool) -> None:
    """keras.Model.fit of a plain Keras model builds its optimizer before Keras's train step is traced
    (tarantella/step/optimizers.py: the step is traced once instead of twice, and trains bitwise the same), and
    with `record` the recorder joins it (Note [Harness-side wiring]). tests/rank_runner.py wraps it alike."""
    import keras

    from tarantella._repro import hook as repro_hook
    from tarantella.step import optimizers

    original_fit = keras.Model.fit
    if getattr(original_fit, "tnt_repro_wrapped", False):
        return

    def fit(self, *args, callbacks=None, **kwargs):
        optimizers.build_for_keras_train_step(self)
        extra = repro_hook.extra_callbacks() if record else []
        if extra:
            callbacks = list(callbacks.callbacks if isinstance(callbacks, keras.callbacks.CallbackList)
                             else callbacks or []) + extra
        return original_fit(self, *args, callbacks=callbacks, **kwargs)

    fit.tnt_repro_wrapped = True
    keras.Model.fit = fit


def _install_calibration(calibration: str) -> None:
    import keras

    from repro import calibration_step
    from tarantella.step import serial_random
    from tarantella.keras.model import Model

    calibration_step.check_supported(calibration)
    serial_random.install()
    for cls in (Model, keras.Model):   # tnt.Model's step does not call keras.Model's: no double reversal
        cls.train_step = _calibration_step(cls.train_step)


def _calibration_step(original_step):
    from repro import calibration_step
    from tarantella._repro import hook as repro_hook
    from tarantella.data import distributed_dataset
    from tarantella.step import serial_random

    def step(self, data):
        with serial_random.rows_reversed(calibration_step.rows_of(data)):
            data = calibration_step.reverse_batch(data)
            if type(self).train_step is step and not getattr(self, "_own_logic", None) \
                    and not distributed_dataset.is_distributed_element(data):
                repro_hook.note(calibration_step.SPLIT_NOTE, True)
                return calibration_step.split_train_step(self, data)  # Note [Calibrating as the ranks round]
            return original_step(self, data)

    return step


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.exit("usage: python repro/runner.py script.py [args]")
    script = os.path.abspath(argv[0])
    from tarantella import determinism
    if os.environ.get("TNT_REPRO_OPS_ONLY") == "1":
        determinism.fix_ops_and_threads(int(os.environ.get("TF_NUM_INTRAOP_THREADS", 1)),
                                        int(os.environ.get("TF_NUM_INTEROP_THREADS", 2)))
    else:
        determinism.apply_from_environment()
    wrap_keras_fit(record=bool(os.environ.get("TNT_REPRO_RECORD")))
    if os.environ.get(wrap.WRAP_VARIABLE) == "1":
        wrap.install()
    if os.environ.get("TNT_REPRO_CALIBRATE"):
        _install_calibration(os.environ["TNT_REPRO_CALIBRATE"])
    sys.argv = [script, *argv[1:]]
    sys.path[0] = os.path.dirname(script)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
