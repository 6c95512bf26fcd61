"""`tnt-repro lint`: static (AST) checks for the reproducibility pitfalls of a training script.

Nothing is executed. Each finding names the file, the line, a code, what is
wrong and the fix. A line ending in `# tnt-repro: ignore` is not reported.

  TNT001  global seeds: Python `random`, numpy and TensorFlow are not all seeded
  TNT002  TensorFlow op determinism is not enabled
  TNT003  thread counts are not fixed (the launcher gives each rank CPUs // ranks)
  TNT004  a random layer (Dropout, GaussianNoise, RandomFlip, ...) or keras.random call without seed=
  TNT005  Dataset.shuffle / list_files without seed=
  TNT006  parallel map/interleave without deterministic=True, or determinism switched off
  TNT007  a source of randomness no seed reaches (unseeded default_rng/Random/RandomState,
          from_non_deterministic_state, tf.timestamp, os.urandom, time- or pid-based seeds)
TNT001-003 are satisfied at once by tarantella.determinism.set_deterministic(seed).
"""
from __future__ import annotations

import ast
import dataclasses

__all__ = ["Finding", "lint_source", "lint_file", "CODES"]

IGNORE_MARK = "# tnt-repro: ignore"

CODES = {
    "TNT001": "global seeds", "TNT002": "op determinism", "TNT003": "thread counts",
    "TNT004": "unseeded random layer", "TNT005": "unseeded shuffle", "TNT006": "non-deterministic tf.data",
    "TNT007": "unseedable randomness",
}

RANDOM_LAYERS = {"Dropout", "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianNoise",
                 "GaussianDropout", "AlphaDropout", "RandomFlip", "RandomRotation", "RandomZoom",
                 "RandomTranslation", "RandomCrop", "RandomContrast", "RandomBrightness", "RandomHeight",
                 "RandomWidth"}
KERAS_RANDOM_FUNCTIONS = {"normal", "uniform", "truncated_normal", "dropout", "shuffle", "categorical",
                          "randint", "gamma", "binomial", "beta"}
RNG_CONSTRUCTORS = {"numpy.random.default_rng", "numpy.random.RandomState", "random.Random",
                    "numpy.random.Generator"}
TIME_LIKE = {"time.time", "time.time_ns", "time.perf_counter", "time.monotonic", "os.getpid",
             "datetime.datetime.now", "datetime.now", "datetime.datetime.utcnow"}
PARALLEL_DATASET_METHODS = {"map", "interleave", "parallel_interleave"}


@dataclasses.dataclass(frozen=True)
class Finding:
    path: str
    line: int
    code: str
    message: str
    fix: str

    def format(self) -> str:
        return f"{self.path}:{self.line}: {self.code} {self.message}; fix: {self.fix}"


class _Names:
    """Dotted names of expressions with import aliases resolved (tf.random.x -> tensorflow.random.x)."""

    def __init__(self, tree: ast.AST):
        self.aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self.aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                        alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def of(self, node: ast.AST) -> str | None:
        parts = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        parts.append(self.aliases.get(node.id, node.id))
        return ".".join(reversed(parts))


def _keyword(call: ast.Call, name: str) -> ast.keyword | None:
    return next((k for k in call.keywords if k.arg == name), None)


def _is_false(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _is_none(node: ast.AST | None) -> bool:
    return node is None or (isinstance(node, ast.Constant) and node.value is None)


def _has_seed(call: ast.Call, positional_index: int | None = None) -> bool:
    keyword = _keyword(call, "seed")
    if keyword is not None:
        return not _is_none(keyword.value)
    return positional_index is not None and len(call.args) > positional_index \
        and not _is_none(call.args[positional_index])


class _Linter(ast.NodeVisitor):
    def __init__(self, path: str, tree: ast.AST):
        self.path = path
        self.names = _Names(tree)
        self.findings: list[Finding] = []
        self.calls: set[str] = set()
        self.rng_names: set[str] = set()
        self.environment_keys: set[str] = set()

    def add(self, node: ast.AST, code: str, message: str, fix: str) -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 1), code, message, fix))

    def visit_Assign(self, node: ast.Assign) -> None:
        if isinstance(node.value, ast.Call) and self.names.of(node.value.func) in RNG_CONSTRUCTORS:
            self.rng_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        for target in node.targets:
            if isinstance(target, ast.Subscript) and self.names.of(target.value) == "os.environ" \
                    and isinstance(target.slice, ast.Constant):
                self.environment_keys.add(str(target.slice.value))
            if isinstance(target, ast.Attribute) and target.attr in ("deterministic", "experimental_deterministic") \
                    and _is_false(node.value):
                self.add(node, "TNT006", "tf.data determinism switched off (options.deterministic = False)",
                         "leave tf.data.Options.deterministic at True")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = self.names.of(node.func) or ""
        last = name.rsplit(".", 1)[-1] if name else (node.func.attr if isinstance(node.func, ast.Attribute) else "")
        self.calls.add(name)
        self._random_layer(node, name, last)
        self._shuffle(node, name, last)
        self._parallel_dataset(node, last)
        self._unseedable(node, name)
        self.generic_visit(node)

    def _random_layer(self, node, name, last):
        if last in RANDOM_LAYERS and not _has_seed(node):
            self.add(node, "TNT004", f"{last} without seed=: its masks/noise come from an unseeded generator",
                     f"pass seed=<int> ({last}(..., seed=42)); note that random layers draw per (micro-)batch, "
                     f"so they cannot match serial training bit for bit")
        elif ".random." in f".{name}" and name.split(".")[0] == "keras" and last in KERAS_RANDOM_FUNCTIONS \
                and not _has_seed(node):
            self.add(node, "TNT004", f"{name} without seed=", "pass seed= (a keras.random.SeedGenerator)")

    def _shuffle(self, node, name, last):
        if last == "shuffle" and isinstance(node.func, ast.Attribute):
            receiver = self.names.of(node.func.value) or ""
            if receiver.endswith("random") or receiver in self.rng_names or name.startswith("keras.") \
                    or name.startswith("tensorflow.random"):
                return  # random.shuffle / np.random.shuffle / rng.shuffle / tf.random.shuffle: not a Dataset
            if not _has_seed(node, positional_index=1):
                self.add(node, "TNT005", "Dataset.shuffle without seed=: every run (and every rank) may shuffle "
                         "in another order", "pass seed=<int> (dataset.shuffle(buffer, seed=42))")
        elif last == "list_files":
            shuffle = _keyword(node, "shuffle")
            if not (shuffle is not None and _is_false(shuffle.value)) and not _has_seed(node, positional_index=2):
                self.add(node, "TNT005", "list_files shuffles the files without seed=",
                         "pass seed=<int>, or shuffle=False")

    def _parallel_dataset(self, node, last):
        deterministic = _keyword(node, "deterministic")
        if deterministic is not None and _is_false(deterministic.value):
            self.add(node, "TNT006", f"{last}(deterministic=False) lets elements arrive in any order",
                     "use deterministic=True")
        elif last in PARALLEL_DATASET_METHODS and _keyword(node, "num_parallel_calls") is not None \
                and deterministic is None:
            self.add(node, "TNT006", f"parallel {last} without deterministic=True: its order follows "
                     "tf.data.Options, which other code may switch off", f"pass deterministic=True to {last}")

    def _unseedable(self, node, name):
        if name in RNG_CONSTRUCTORS and not node.args and not _keyword(node, "seed"):
            self.add(node, "TNT007", f"{name}() without a seed draws from the operating system, not from any "
                     "global seed", f"pass a seed: {name}(42)")
        elif name.endswith("from_non_deterministic_state") or name in ("tensorflow.timestamp", "os.urandom"):
            self.add(node, "TNT007", f"{name} differs in every run", "derive the value from a fixed seed")
        seed_arguments = [k.value for k in node.keywords if k.arg == "seed"]
        if name.endswith(("seed", "set_deterministic", "set_random_seed")):
            seed_arguments += list(node.args)
        for argument in seed_arguments:
            for inner in ast.walk(argument):
                if isinstance(inner, ast.Call) and self.names.of(inner.func) in TIME_LIKE:
                    self.add(inner, "TNT007", f"a seed taken from {self.names.of(inner.func)} differs in every run",
                             "use a fixed seed (a constant or a command-line argument)")

    def script_level(self, tree: ast.Module) -> None:
        """TNT001-003: set-up the whole script needs once."""
        def called(*suffixes):
            return any(name.endswith(suffixes) for name in self.calls if name)

        if called("set_deterministic"):
            return
        line = next((node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))), tree)
        line = line if hasattr(line, "lineno") else ast.Module(body=[], type_ignores=[])
        if not called("set_random_seed"):
            missing = [label for label, suffixes in (("TensorFlow (tf.random.set_seed)", ("random.set_seed",)),
                                                     ("numpy (np.random.seed)", ("numpy.random.seed",)),
                                                     ("Python random (random.seed)", ("random.seed",)))
                       if not called(*suffixes) or (suffixes == ("random.seed",) and not any(
                           name == "random.seed" for name in self.calls))]
            if missing:
                self.add(line, "TNT001", "not seeded: " + ", ".join(missing),
                         "call tarantella.determinism.set_deterministic(seed) first in the script (seeds all of "
                         "them; PYTHONHASHSEED must be set before Python starts: the harness does)")
        if not called("enable_op_determinism") and "TF_DETERMINISTIC_OPS" not in self.environment_keys:
            self.add(line, "TNT002", "TensorFlow op determinism is not enabled",
                     "call tarantella.determinism.set_deterministic(seed) (or "
                     "tf.config.experimental.enable_op_determinism())")
        if not called("set_intra_op_parallelism_threads"):
            self.add(line, "TNT003", "thread counts are not fixed: the launcher gives every rank CPUs // ranks "
                     "intra-op threads, so serial and distributed runs reduce in different orders",
                     "call tarantella.determinism.set_deterministic(seed) before TensorFlow starts (1 intra-op "
                     "thread), or tf.config.threading.set_intra_op_parallelism_threads(1)")


def lint_source(source: str, path: str = "<string>") -> list[Finding]:
    tree = ast.parse(source, filename=path)
    linter = _Linter(path, tree)
    linter.visit(tree)
    linter.script_level(tree)
    lines = source.splitlines()
    kept = [f for f in linter.findings
            if not (0 < f.line <= len(lines) and lines[f.line - 1].rstrip().endswith(IGNORE_MARK))]
    return sorted(set(kept), key=lambda f: (f.line, f.code))


def lint_file(path: str) -> list[Finding]:
    with open(path, encoding="utf-8") as handle:
        return lint_source(handle.read(), path)
