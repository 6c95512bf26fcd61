"""`tnt-repro check --wrap`: train an unmodified plain Keras script's model through tnt.Model.

Note [Wrapping a script that never heard of tarantella]
Installed by repro/runner.py (TNT_REPRO_WRAP=1) before the script runs, only through
Keras's public methods: `keras.Model.compile` on a model that is not a tnt.Model builds
`tnt.Model(model)` and compiles that instead (same arguments); `fit`, `evaluate` and
`predict` of the user's model then go to its tnt.Model. The user's model keeps its
variables (the tnt.Model shares them), so everything the script does with it afterwards
(save, get_weights, summary) sees the trained weights. batch_size keeps its meaning: for
tnt.Model it is the global batch, as it is for serial Keras. The wrapper is kept in a table
beside the model, not as an attribute, so that Keras does not track it as a sub-layer.
tnt.Model's own compile and fit call keras.Model's (super() and the wrapped model's
compile); those calls pass through untouched.
"""
from __future__ import annotations

import functools
import threading

__all__ = ["WRAP_VARIABLE", "install"]

WRAP_VARIABLE = "TNT_REPRO_WRAP"

_wrappers: dict[int, tuple[object, object]] = {}    # id(user model) -> (user model, its tnt.Model)
_inside = threading.local()


def _wrapper_of(model):
    entry = _wrappers.get(id(model))
    return entry[1] if entry is not None and entry[0] is model else None


def install() -> None:
    import keras

    from tarantella.keras.model import Model as TntModel

    if getattr(keras.Model.compile, "tnt_repro_wrap", False):
        return
    original_compile = keras.Model.compile

    @functools.wraps(original_compile)
    def compile(self, *args, **kwargs):
        if isinstance(self, TntModel) or getattr(_inside, "active", False) or \
                type(self).__module__.startswith("tarantella."):
            return original_compile(self, *args, **kwargs)
        _inside.active = True
        try:
            wrapper = _wrapper_of(self) or TntModel(self)
            _wrappers[id(self)] = (self, wrapper)
            wrapper.compile(*args, **kwargs)
        finally:
            _inside.active = False

    compile.tnt_repro_wrap = True
    keras.Model.compile = compile
    for name in ("fit", "evaluate", "predict"):
        _delegate(keras.Model, name)


def _delegate(cls, name: str) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        wrapper = _wrapper_of(self)
        if wrapper is None:
            return original(self, *args, **kwargs)
        return getattr(wrapper, name)(*args, **kwargs)

    setattr(cls, name, method)
