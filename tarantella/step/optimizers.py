"""What every strategy asks of a Keras optimizer: the optimizers a model trains with, the one that applies
unscaled gradients, an unbuilt copy to save the whole model's state into, and building one before the train
step that applies it is traced."""
from __future__ import annotations

import keras

__all__ = ["optimizers_of", "unscaled_optimizer", "unbuilt_copy", "build_before_tracing"]


def optimizers_of(model: keras.Model) -> list:
    """The model's optimizer and every optimizer held in one of its attributes (a GAN's two), each once.
    A LossScaleOptimizer counts as one (its apply calls its inner optimizer's)."""
    found = []
    for candidate in [getattr(model, "optimizer", None)] + list(vars(model).values()):
        if isinstance(candidate, keras.optimizers.Optimizer) and all(candidate is not f for f in found):
            found.append(candidate)
    return found


def unscaled_optimizer(optimizer):
    """The optimizer that applies the unscaled gradients: a LossScaleOptimizer's inner one, else itself."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def unbuilt_copy(optimizer):
    """A new optimizer configured as `optimizer`, without its state (the whole model's optimizer that a pipeline
    stage or a sharded rank writes into when saving). Keras's config leaves out the weight-decay exclusions
    (exclude_from_weight_decay), which the copy keeps."""
    copy = optimizer.__class__.from_config(optimizer.get_config())
    for source, target in ((optimizer, copy), (getattr(optimizer, "inner_optimizer", None),
                                               getattr(copy, "inner_optimizer", None))):
        for name in ("_exclude_from_weight_decay", "_exclude_from_weight_decay_pattern"):
            if source is not None and hasattr(source, name):
                setattr(target, name, getattr(source, name))
    return copy


def build_before_tracing(optimizer, variables) -> None:
    """Note [The optimizer is built before the step is traced]
    A tf.function that creates variables in its first trace is traced a second time (TensorFlow lifts the
    variables' initializers out, then traces the function again without them), and an optimizer left unbuilt
    creates its slots in its first apply, inside the traced train step: Keras itself defers the build to that
    point when no tf.distribute strategy is set ("backwards compatibility"; under one it builds first, in
    _symbolic_build). Tracing is most of a small model's first step, so a train step whose optimizer applies to
    `variables` (the model's trainable variables, in Keras's own train step) has it built just before, as that
    first apply would: the same variables, names and zeros, so training is bitwise the same
    (tests/keras/test_optimizer_built_first.py). Used by tnt.Model's own train step (measured:
    tests/keras/programs/sharded_optimizer.py at one rank traces 57 train steps instead of 83 and takes 33.5 s
    instead of 44.1) and by the serial runs of plain Keras in tnt-repro and the test launches (repro/runner.py
    wrap_keras_fit). A model's own train_step is left to build its optimizers itself: it may apply them to other
    variables than the model's (a GAN's two optimizers)."""
    if optimizer is None or optimizer.built:
        return
    with keras.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(variables)
    optimizer.built = True


def build_for_keras_train_step(model) -> None:
    """Before `fit` of a plain Keras model (a serial reference): its optimizer built as Keras's own train step
    would build it in its first trace (Note [The optimizer is built before the step is traced]), where that
    step is the one that applies it (no train_step of the model's own) and the model's variables exist (a
    subclassed model not yet called builds them in that trace too: left to Keras)."""
    if type(model).train_step is not keras.Model.train_step or not model.built:
        return
    if getattr(model, "compiled", False):
        build_before_tracing(model.optimizer, model.trainable_variables)
