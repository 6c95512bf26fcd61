"""The TensorFlow op library (csrc/tf), compiled on first use against the
installed TensorFlow.

A library built for one TensorFlow release fails with undefined symbols under
another, so it is never shipped prebuilt: it is compiled with the installed
TensorFlow's own compile and link flags and cached under
`${TNT_CACHE_DIR:-~/.cache/tarantella}/tf-ops-<tf version>-<hash>/`, where the
hash covers the sources, the flags, the compiler and the engine library, so a
changed input never reuses a stale build. Concurrent ranks take a file lock:
one compiles, the others wait and load its result.
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import glob
import hashlib
import os
import subprocess
import tempfile

__all__ = ["load_ops", "OpLibraryError", "library_path"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_COMPILER_FLAGS = ["-O2", "-std=c++17", "-fPIC", "-Wno-deprecated-declarations"]


class OpLibraryError(RuntimeError):
    """The op library could not be built or loaded for the installed TensorFlow."""


def _source_dirs() -> tuple[str, str]:
    """(directory of the op sources, directory holding c_api.h): the repository
    layout for an editable install, else the copy installed into the package."""
    repo = os.path.dirname(_PACKAGE_DIR)
    in_repo = (os.path.join(repo, "csrc", "tf"), os.path.join(repo, "csrc", "engine"))
    installed = (os.path.join(_PACKAGE_DIR, "csrc", "tf"), os.path.join(_PACKAGE_DIR, "csrc"))
    for sources, header_dir in (in_repo, installed):
        if glob.glob(os.path.join(sources, "*.cc")) and os.path.isfile(os.path.join(header_dir, "c_api.h")):
            return sources, header_dir
    raise OpLibraryError(f"tarantella: the TensorFlow op sources are missing (looked in {in_repo[0]} and "
                         f"{installed[0]}); reinstall tarantella")


def _engine_dir() -> str:
    from tarantella import _engine
    directory = os.path.dirname(os.path.abspath(_engine.__file__))
    if not os.path.isfile(os.path.join(directory, "libtnt_engine.so")):
        raise OpLibraryError(f"tarantella: libtnt_engine.so is not next to {_engine.__file__}; reinstall tarantella")
    return directory


def _compiler() -> str:
    return os.environ.get("CXX", "g++")


def _sources() -> list[str]:
    return sorted(glob.glob(os.path.join(_source_dirs()[0], "*.cc")))


def _compile_command(tf, source: str, output: str) -> list[str]:
    return [_compiler(), "-c", source, "-o", output, f"-I{_source_dirs()[1]}", *_COMPILER_FLAGS,
            *tf.sysconfig.get_compile_flags()]


def _link_command(tf, objects: list[str], output: str) -> list[str]:
    engine_dir = _engine_dir()
    return [_compiler(), "-shared", *objects, "-o", output, *tf.sysconfig.get_link_flags(), f"-L{engine_dir}",
            "-ltnt_engine", f"-Wl,-rpath,{engine_dir}"]


def _build_commands(tf, directory: str, output: str) -> list[list[str]]:
    """One compile per source (run side by side), then the link."""
    objects = [os.path.join(directory, os.path.basename(source) + ".o") for source in _sources()]
    return [_compile_command(tf, source, obj) for source, obj in zip(_sources(), objects)] + \
        [_link_command(tf, objects, output)]


def _fingerprint(tf) -> str:
    sources, header_dir = _source_dirs()
    digest = hashlib.sha256()
    inputs = sorted(glob.glob(os.path.join(sources, "*.cc")) + glob.glob(os.path.join(sources, "*.h")))
    headers = sorted(glob.glob(os.path.join(header_dir, "c_api*.h")))
    for path in inputs + headers + [os.path.join(_engine_dir(), "libtnt_engine.so")]:
        with open(path, "rb") as handle:
            digest.update(os.path.basename(path).encode() + handle.read())
    digest.update(" ".join(" ".join(command) for command in _build_commands(tf, "DIR", "OUT")).encode())
    try:
        version = subprocess.run([_compiler(), "--version"], capture_output=True, text=True).stdout
    except OSError:
        version = ""
    digest.update(version.encode())
    return digest.hexdigest()[:16]


def library_path() -> str:
    """Where the op library for the installed TensorFlow lives (once built)."""
    import tensorflow as tf
    cache = os.environ.get("TNT_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "tarantella")
    return os.path.join(cache, f"tf-ops-{tf.__version__}-{_fingerprint(tf)}", "libtnt_tf_ops.so")


def _run(tf, command: list[str]) -> None:
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except OSError as error:
        raise OpLibraryError(f"tarantella: cannot run the C++ compiler {_compiler()!r} to build the TensorFlow "
                             f"ops for TensorFlow {tf.__version__}: {error}; install g++ or set CXX") from None
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).strip().splitlines()[-15:])
        raise OpLibraryError(f"tarantella: building the TensorFlow ops for the installed TensorFlow "
                             f"{tf.__version__} failed (exit {result.returncode}); compiler output ends:\n{tail}\n"
                             f"command: {' '.join(command)}")


def _compile(tf, target: str) -> None:
    """The sources compile side by side on the cores this process may use (a fresh install's first import
    waits for the slowest one, not for their sum), then link into `target` atomically."""
    with tempfile.TemporaryDirectory(prefix=".building-", dir=os.path.dirname(target)) as scratch:
        *compiles, link = _build_commands(tf, scratch, os.path.join(scratch, "libtnt_tf_ops.so"))
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
            for finished in [pool.submit(_run, tf, command) for command in compiles]:
                finished.result()  # the first failure, in source order
        _run(tf, link)
        os.replace(link[link.index("-o") + 1], target)  # atomic: a reader sees no library or a complete one


@functools.lru_cache(maxsize=None)
def load_ops():
    """The loaded op module (tnt_start_allreduce, tnt_finish_allreduce); built first if needed."""
    import tensorflow as tf
    target = library_path()
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not os.path.isfile(target):
        with open(os.path.join(os.path.dirname(target), ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not os.path.isfile(target):
                    _compile(tf, target)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    try:
        return tf.load_op_library(target)
    except (tf.errors.NotFoundError, OSError) as error:
        raise OpLibraryError(f"tarantella: the op library {target} does not load into TensorFlow "
                             f"{tf.__version__}: {error}; delete that directory to rebuild it") from None
