"""`import tarantella` stays TensorFlow-free; the op library is built for the installed TensorFlow."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_python(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2", **env})


@pytest.mark.timeout(150)
def test_import_tarantella_does_not_import_tensorflow():
    result = run_python("import sys, tarantella as tnt; print('tensorflow' in sys.modules); "
                        "tnt.ParallelStrategy; print('tensorflow' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


@pytest.mark.timeout(150)
def test_op_library_matches_the_installed_tensorflow(tmp_path):
    result = run_python("import tensorflow as tf; from tarantella import tf_ops; ops = tf_ops.load_ops(); "
                        "print(tf_ops.library_path()); print(tf.__version__); "
                        "print(hasattr(ops, 'tnt_start_allreduce') and hasattr(ops, 'tnt_finish_allreduce'))",
                        TNT_CACHE_DIR=str(tmp_path))
    assert result.returncode == 0, result.stderr
    path, version, found = result.stdout.split()
    assert path.startswith(str(tmp_path)) and f"tf-ops-{version}-" in path and os.path.isfile(path)
    assert found == "True"


@pytest.mark.timeout(150)
def test_a_failed_build_says_which_tensorflow_and_why(tmp_path):
    result = run_python("from tarantella import tf_ops; tf_ops.load_ops()", TNT_CACHE_DIR=str(tmp_path),
                        CXX="false")
    assert result.returncode != 0
    assert "OpLibraryError" in result.stderr and "building the TensorFlow ops for the installed TensorFlow" \
        in result.stderr
