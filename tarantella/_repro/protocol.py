"""What `tnt-repro check` (the harness, repro/) and the runs it starts tell each other: the environment
variables it sets for a run and the notes a run writes into its record.

One home for these names, free of TensorFlow: the harness process only starts runs and reads their records,
and importing Keras there cost each check ~4 s before its first run started.
"""
from __future__ import annotations

__all__ = ["RECORD_VARIABLE", "REFERENCE_VARIABLE", "STORE_WEIGHTS_VARIABLE", "MAX_STEPS_VARIABLE",
           "MAX_EPOCHS_VARIABLE", "CALIBRATION_SPLIT_NOTE", "ENDED_FILE"]

RECORD_VARIABLE = "TNT_REPRO_RECORD"                # the run's record directory: the recorder joins its first fit
REFERENCE_VARIABLE = "TNT_REPRO_REFERENCE"          # the record whose stored weights the master rank compares with
STORE_WEIGHTS_VARIABLE = "TNT_REPRO_STORE_WEIGHTS"  # "1": store the master rank's weights per step (a reference)
MAX_STEPS_VARIABLE = "TNT_REPRO_MAX_STEPS"          # stop training after K steps
MAX_EPOCHS_VARIABLE = "TNT_REPRO_MAX_EPOCHS"        # stop training after E epochs

# The record's note that the calibration run split each batch's gradients as two ranks do
# (Note [Calibrating as the ranks round] in repro/calibration_step.py); the tolerance reads it.
CALIBRATION_SPLIT_NOTE = "calibration_split_gradients"

# Written by the harness into a run's record directory once the run's processes have ended, whatever their exit
# code: a run that reads this one as its reference while both run stops waiting for steps it will never store
# (Note [Reading a reference while it runs] in tarantella/_repro/weights.py).
ENDED_FILE = "ended"
