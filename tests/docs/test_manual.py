"""The manual (docs/, issue 40 §2): it builds with Sphinx with warnings as errors, and every Python block in it
runs at 1 and 2 ranks, as a user would run it."""
import importlib
import os
import re
import shlex
import subprocess
import sys

import pytest

from tests.launches import TRAINING
from tests.multirank import REPO_ROOT

sys.path.insert(0, os.path.join(REPO_ROOT, "docs", "_ext"))
from code_blocks import command_lines, python_blocks  # noqa: E402

README = os.path.join(REPO_ROOT, "README.md")


@pytest.mark.timeout(300)
def test_the_manual_builds_with_warnings_as_errors(tmp_path):
    build = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                            os.path.join(REPO_ROOT, "docs"), str(tmp_path / "html")],
                           capture_output=True, text=True, timeout=280)
    assert build.returncode == 0, build.stderr[-4000:]
    cli = re.sub(r"<[^>]+>", "", (tmp_path / "html" / "reference" / "cli.html").read_text())
    for command in ("tarantella --help", "tnt-repro check --help", "tnt-bench scaling --help"):
        assert command in cli, command


def test_the_manual_has_a_python_block_per_guide_that_trains():
    pages = {where.split(":")[0] for where, _ in python_blocks()}
    assert {"quickstart.md", "guides/data_parallelism.md", "guides/own_training_logic.md", "guides/pipelining.md",
            "guides/sharding.md", "guides/mixed_precision.md"} <= pages


@TRAINING.test("manual_blocks")
@pytest.mark.parametrize("n", [1, 2])
def test_every_python_block_of_the_manual_runs(n):
    run = TRAINING.run("manual_blocks", n).check()
    expected = [f"OK {where}" for where, _ in python_blocks()]
    for rank in range(n):
        assert [line for line in run.rank_stdout[rank].splitlines() if line.startswith("OK ")] == expected, \
            (rank, run.stderr[-3000:])


PARSERS = {"tarantella": "tarantella.launcher.cli", "tnt-repro": "repro.cli", "tnt-bench": "bench.cli"}


def test_every_documented_command_line_is_one_its_tool_accepts():
    """The manual's shell lines of the three tools parse with the tools' own parsers, so a renamed or removed
    flag fails here (they are not run: their scripts and hosts are the reader's)."""
    lines = [(where, line) for where, line in command_lines() if line.split()[0] in PARSERS]
    assert len(lines) >= 10
    for where, line in lines:
        tool, *argv = shlex.split(line, comments=True)
        if argv == ["--help"]:
            continue
        parser = importlib.import_module(PARSERS[tool]).build_parser()
        try:
            parser.parse_args(argv)
        except (SystemExit, Exception) as error:   # argparse exits; tnt-bench's and tnt-repro's raise
            pytest.fail(f"{where}: {tool} does not accept {line!r}: {error}")


def test_the_readme_fits_one_screen_and_points_to_the_manual():
    text = open(README, encoding="utf-8").read()
    assert len(text.splitlines()) <= 120
    assert "docs/" in text and "sphinx-build" in text
