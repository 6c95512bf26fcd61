"""Model profiles of Keras applications, for predicting published results of other systems.

A published benchmark gives throughputs, not our profile.json; what the simulation needs
besides the cluster's published single-device throughput is each gradient's size and
when backprop completes it. Those follow from the architecture alone (keras.applications,
no weights), through the same estimate as measured profiles (bench/simulate/model_profile.py:
gradient_timeline). The forward/backward split is the usual 1 : 2 of their flops (the
backward pass computes two products per forward one); the update counts as nothing (the
published figures include it in the step). Written once to bench/validation/models/NAME.json:

    python -m bench.validation.applications        # about a minute
"""
from __future__ import annotations

import os

__all__ = ["APPLICATIONS", "MODELS_DIR", "build_profile", "load_application_profile"]

MODELS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models")
# name -> (keras.applications constructor, input side)
APPLICATIONS = {"resnet101": ("ResNet101", 224), "inception_v3": ("InceptionV3", 299), "vgg16": ("VGG16", 224)}


def build_profile(name: str) -> dict:
    import keras
    import numpy as np
    from bench.simulate.model_profile import batch_norm_layers, gradient_timeline
    constructor, side = APPLICATIONS[name]
    model = getattr(keras.applications, constructor)(weights=None, input_shape=(side, side, 3), classes=1000)
    example = np.zeros((1, side, side, 3), dtype="float32")
    gradients = gradient_timeline(model, example)
    return {"model": name, "micro_batch": 1, "step_s": 1.0, "forward_s": 1.0 / 3.0, "backward_s": 2.0 / 3.0,
            "update_s": 0.0, "fixed_s": 0.0, "per_example_s": 1.0, "gradients": gradients,
            "batch_norm": batch_norm_layers(model),
            "parameters": int(model.count_params()),
            "source": f"keras.applications.{constructor}(weights=None), {side}x{side}, keras {keras.__version__}; "
                      f"forward:backward = 1:2 (flops), update 0"}


def load_application_profile(name: str) -> dict:
    from bench.simulate.model_profile import load_profile
    path = os.path.join(MODELS_DIR, f"{name}.json")
    if not os.path.exists(path):
        from bench.errors import BenchUsageError
        raise BenchUsageError(f"{path} is missing: write it with `python -m bench.validation.applications`")
    return load_profile(path)


if __name__ == "__main__":
    from bench.simulate.model_profile import save_profile
    os.makedirs(MODELS_DIR, exist_ok=True)
    for application in APPLICATIONS:
        profile = build_profile(application)
        save_profile(profile, os.path.join(MODELS_DIR, f"{application}.json"))
        print(application, len(profile["gradients"]), "gradients,",
              sum(g["bytes"] for g in profile["gradients"]) / 1e6, "MB")
