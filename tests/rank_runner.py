"""The rank side of a shared launch (tests/multirank.py, SharedLaunch): runs several test programs one after
the other in this one process per rank, so that a launch imports TensorFlow and starts the engine once.

    python tests/rank_runner.py '[["name", "/path/program.py", "arg", ...], ...]'

Each program runs as `python program.py args` would run it (runpy as __main__, its directory first on
sys.path, its arguments in sys.argv) between two marker lines, on stdout and on stderr alike:

    @@tnt-begin <name>
    ... the program's output ...
    @@tnt-end <name> 0

A program that ends with SystemExit(0) or returns gets its end marker and the next one runs. One that raises,
or exits with another code, ends this process with its exception and exit code, as it would have ended a
launch of its own, and has no end marker: the launcher then stops every rank, and the tests of the programs
that did not run fail, naming it.

Between programs the runner puts back what a program may change for the whole process and that a later
program would otherwise inherit: Keras's float type, dtype policy and image data format, TensorFlow's op
determinism and Grappler's options, the environment, the modules imported from the program's own
directory (two directories may hold helpers of the same name), and Keras's global state (clear_session).

A program that trains with Keras gets keras.Model.fit wrapped as tnt-repro's runs have it
(repro/runner.py wrap_keras_fit): a plain Keras model's optimizer is built before its train step is traced,
so that the serial references trace their step once instead of twice, with the same result to the bit
(tests/keras/test_optimizer_built_first.py checks it); tnt.Model does the same for its own step.
"""
import gc
import json
import os
import runpy
import sys

BEGIN, END = "@@tnt-begin", "@@tnt-end"


def _mark(text: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        stream.write(text + "\n")
        stream.flush()


def _modules_from(directory: str) -> list[str]:
    prefix = os.path.join(os.path.abspath(directory), "")
    return [name for name, module in list(sys.modules.items())
            if os.path.abspath(getattr(module, "__file__", None) or "/").startswith(prefix)]


class _ProcessState:
    """What one program may change for the whole process, taken before it runs and put back after."""

    def __init__(self):
        self.environ = dict(os.environ)
        self.path = list(sys.path)
        self.modules = set(sys.modules)
        self.keras = None
        if "keras" in sys.modules:
            import keras
            self.keras = (keras.config.floatx(), keras.config.image_data_format(), _explicit_dtype_policy())
        self.determinism = _op_determinism()
        self.graph_options = _graph_options()

    def restore(self, directory: str) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        sys.path[:] = self.path
        for name in _modules_from(directory):
            if name not in self.modules:
                del sys.modules[name]
        if "keras" in sys.modules:
            import keras
            floatx, data_format, policy = self.keras or ("float32", "channels_last", None)
            keras.config.set_floatx(floatx)
            keras.config.set_image_data_format(data_format)
            keras.backend.clear_session()   # also forgets a dtype policy set since
            if policy is not None:
                keras.config.set_dtype_policy(policy)
        if "tensorflow" in sys.modules and _op_determinism() != self.determinism:
            from tensorflow.python.framework import config
            (config.enable_op_determinism if self.determinism else config.disable_op_determinism)()
        if "tensorflow" in sys.modules and _graph_options() != self.graph_options:
            from tensorflow.python.eager import context
            # tf.config.optimizer.set_experimental_options adds to the options and cannot remove one; this
            # is what it does, with the options as they were.
            context.context()._optimizer_experimental_options = dict(self.graph_options or {})
            context.context()._thread_local_data.function_call_options = None
        gc.collect()


def _explicit_dtype_policy():
    """The dtype policy a program set, or None: Keras then follows floatx (keras.config.dtype_policy() would
    fix the current one, so that a later set_floatx no longer changes it)."""
    from keras.src.backend.common import global_state
    return global_state.get_global_attribute("dtype_policy", None)


def _graph_options() -> dict | None:
    """Grappler's options a program set (tf.config.optimizer.set_experimental_options)."""
    if "tensorflow" not in sys.modules:
        return None
    from tensorflow.python.eager import context
    return dict(context.context()._optimizer_experimental_options)


def _op_determinism() -> bool:
    if "tensorflow" not in sys.modules:
        return False
    from tensorflow.python.framework import config
    return config.is_op_determinism_enabled()


def _trains_with_keras(path: str) -> bool:
    """Whether the program names Keras (importing it for one that does not would cost seconds)."""
    with open(path, encoding="utf-8") as source:
        return "keras" in source.read()


def run(programs: list[list[str]]) -> None:
    for name, path, *args in programs:
        directory = os.path.dirname(os.path.abspath(path))
        if _trains_with_keras(path):
            from repro.runner import wrap_keras_fit
            wrap_keras_fit(record=False)
        state = _ProcessState()
        sys.argv = [path, *args]
        sys.path.insert(0, directory)
        _mark(f"{BEGIN} {name}")
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise
        # Any other exception ends this rank as it would have ended the program alone (tarantella's excepthook
        # included), its traceback after the begin marker, and no end marker: the program did not end here.
        _mark(f"{END} {name} 0")
        state.restore(directory)


if __name__ == "__main__":
    run(json.loads(sys.argv[1]))
