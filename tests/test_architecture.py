"""The floors of the house (tarantella/__init__.py names them) run one way: import-linter's contracts in
pyproject.toml, checked here so that a change importing upward fails with the two modules' names. The
contracts' ignore_imports are today's debts (issue 40 §1); one that no longer occurs fails too
(import-linter's default), so the list only shrinks."""
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_floors_run_one_way(capsys):
    cli = pytest.importorskip("importlinter.cli", reason="import-linter is in the test extra")
    code = cli.lint_imports(config_filename=os.path.join(REPO, "pyproject.toml"), no_cache=True)
    assert code == 0, capsys.readouterr().out[-6000:]
