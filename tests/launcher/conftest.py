"""Fixtures shared by the launcher tests."""
import pytest


@pytest.fixture
def script(tmp_path):
    """A training script that exists (the launcher refuses a missing .py); dry runs never run it."""
    path = tmp_path / "train.py"
    path.write_text("print('hello')\n")
    return str(path)
