"""Fixtures of the tnt-bench tests: a fake 1-device profile file, and running the CLI in-process."""
from __future__ import annotations

import json

import pytest

from bench.cli import main
from bench_helpers import fake_profile


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(fake_profile()))
    return str(path)


@pytest.fixture
def run_cli(capsys):
    def run(*argv):
        code = main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err
    return run
