"""tnt-repro lint: pure AST, no TensorFlow."""
import os
import textwrap

import pytest

from repro import cli, lint

pytestmark = pytest.mark.timeout(30)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = sorted(os.path.join(REPO, "examples", name) for name in os.listdir(os.path.join(REPO, "examples"))
                  if name.endswith(".py"))
PLANTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "planted.py")

SEEDED_HEADER = "from tarantella.determinism import set_deterministic\nset_deterministic(1)\n"


def codes(source, seeded=True):
    """(the flagged line's text, code) per finding."""
    source = (SEEDED_HEADER if seeded else "") + textwrap.dedent(source)
    lines = source.splitlines()
    return [(lines[f.line - 1].strip() if f.line else "", f.code) for f in lint.lint_source(source)]


@pytest.mark.parametrize("path", EXAMPLES, ids=os.path.basename)
def test_no_findings_on_the_examples(path):
    assert EXAMPLES and lint.lint_file(path) == []


def test_the_planted_pitfalls_are_found_with_their_lines():
    found = {(f.code, f.line) for f in lint.lint_file(PLANTED)}
    with open(PLANTED) as handle:
        lines = handle.read().splitlines()
    line_of = lambda text: next(i for i, line in enumerate(lines, 1) if text in line)  # noqa: E731
    assert ("TNT005", line_of("dataset.shuffle(64)")) in found
    assert ("TNT004", line_of("keras.layers.Dropout(0.5)")) in found
    assert ("TNT007", line_of("tf.timestamp() * 1e6")) in found
    assert {"TNT001", "TNT002", "TNT003"} <= {code for code, _ in found}


def test_unseeded_shuffle_and_list_files():
    assert codes("""
        import tensorflow as tf
        a = tf.data.Dataset.range(4).shuffle(4)
        b = tf.data.Dataset.range(4).shuffle(4, seed=2)
        c = tf.data.Dataset.range(4).shuffle(4, 2)
        d = tf.data.Dataset.list_files("*.png")
        e = tf.data.Dataset.list_files("*.png", shuffle=False)
        f = tf.data.Dataset.list_files("*.png", seed=3)
    """) == [("a = tf.data.Dataset.range(4).shuffle(4)", "TNT005"),
             ('d = tf.data.Dataset.list_files("*.png")', "TNT005")]


def test_shuffles_that_are_not_datasets_are_not_reported():
    assert codes("""
        import random
        import numpy as np
        from numpy.random import default_rng
        random.shuffle([1, 2]); np.random.shuffle([1, 2])
        rng = np.random.default_rng(5); rng.shuffle([1, 2])
        other = default_rng(6); other.shuffle([1, 2])
    """) == []


def test_random_layers_need_seeds():
    assert codes("""
        import keras
        from keras import layers
        a = keras.layers.Dropout(0.5)
        b = layers.Dropout(0.5, seed=1)
        c = layers.GaussianNoise(0.1)
        d = keras.layers.RandomFlip()
        e = keras.random.normal((2,))
        f = keras.random.normal((2,), seed=keras.random.SeedGenerator(1))
    """) == [("a = keras.layers.Dropout(0.5)", "TNT004"), ("c = layers.GaussianNoise(0.1)", "TNT004"),
             ("d = keras.layers.RandomFlip()", "TNT004"), ("e = keras.random.normal((2,))", "TNT004")]


def test_parallel_datasets_need_deterministic_true():
    assert codes("""
        import tensorflow as tf
        ds = tf.data.Dataset.range(4)
        a = ds.map(abs)
        b = ds.map(abs, num_parallel_calls=2)
        c = ds.map(abs, num_parallel_calls=2, deterministic=True)
        d = ds.interleave(lambda x: ds, num_parallel_calls=2, deterministic=False)
        options = tf.data.Options()
        options.deterministic = False
        pool_result = map(abs, [1])
    """) == [("b = ds.map(abs, num_parallel_calls=2)", "TNT006"),
             ("d = ds.interleave(lambda x: ds, num_parallel_calls=2, deterministic=False)", "TNT006"),
             ("options.deterministic = False", "TNT006")]


def test_unseedable_sources():
    assert codes("""
        import time, os
        import numpy as np
        import tensorflow as tf
        a = np.random.default_rng()
        b = np.random.default_rng(1)
        c = tf.timestamp()
        np.random.seed(int(time.time()))
        g = tf.random.Generator.from_non_deterministic_state()
        h = os.urandom(4)
        t = time.time()
    """) == [("a = np.random.default_rng()", "TNT007"), ("c = tf.timestamp()", "TNT007"),
             ("np.random.seed(int(time.time()))", "TNT007"),
             ("g = tf.random.Generator.from_non_deterministic_state()", "TNT007"),
             ("h = os.urandom(4)", "TNT007")]


def test_script_level_set_up():
    assert {code for _, code in codes("import tensorflow as tf\n", seeded=False)} == {"TNT001", "TNT002", "TNT003"}
    assert codes("import tarantella as tnt\ntnt.set_deterministic(3)\n", seeded=False) == []
    partial = codes("""
        import random, numpy as np, tensorflow as tf
        tf.random.set_seed(1); np.random.seed(1); random.seed(1)
        tf.config.experimental.enable_op_determinism()
        tf.config.threading.set_intra_op_parallelism_threads(1)
    """, seeded=False)
    assert partial == []
    only_tf = lint.lint_source("import tensorflow as tf\ntf.random.set_seed(1)\n")
    tnt001 = [f for f in only_tf if f.code == "TNT001"]
    assert len(tnt001) == 1 and "numpy" in tnt001[0].message and "Python random" in tnt001[0].message


def test_ignore_mark():
    assert codes("import keras\nd = keras.layers.Dropout(0.1)  # tnt-repro: ignore\n") == []


def test_cli_lint_exit_codes(capsys):
    assert cli.main(["lint", *EXAMPLES]) == 0
    assert cli.main(["lint", PLANTED]) == 1
    out = capsys.readouterr().out
    assert f"{PLANTED}:" in out and "TNT005" in out and "fix:" in out
    assert cli.main(["lint", "/no/such/file.py"]) == 2
    assert "tnt-repro: error: no such script" in capsys.readouterr().err


def test_cli_lint_syntax_error(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    assert cli.main(["lint", str(broken)]) == 2
    assert "cannot parse" in capsys.readouterr().err
