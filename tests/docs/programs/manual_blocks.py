"""Run every Python code block of the manual (docs/**/*.md) on this rank, each in a namespace of its own, as a
user would paste it into a script run by `tarantella -n N`. Prints "OK <page>:<line>" per block; a block that
raises ends the program with its traceback."""
import os
import sys

import keras

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                    "docs")
sys.path.insert(0, os.path.join(DOCS, "_ext"))
from code_blocks import python_blocks  # noqa: E402

for where, source in python_blocks():
    exec(compile(source, where, "exec"), {"__name__": "__main__"})
    keras.mixed_precision.set_global_policy("float32")   # as a new script would start
    keras.backend.clear_session()
    print(f"OK {where}", flush=True)
