"""The floors of the house (tarantella/__init__.py names them) run one way: import-linter's contracts in
pyproject.toml, checked here so that a change importing upward fails with the two modules' names."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_floors_run_one_way():
    pytest.importorskip("importlinter", reason="import-linter is in the test extra")
    # Its own process: import-linter's console output does not mix with pytest's capture.
    done = subprocess.run([sys.executable, "-c", "import sys; from importlinter.cli import lint_imports; "
                           "sys.exit(lint_imports(config_filename='pyproject.toml', no_cache=True))"],
                          capture_output=True, text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
