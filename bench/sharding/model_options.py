"""The model options of bench/sharding/program.py, as the sharding benchmarks that launch it declare and pass them."""
from __future__ import annotations

import argparse

__all__ = ["add_model_options", "program_arguments"]


def add_model_options(parser: argparse.ArgumentParser, depth: int) -> None:
    parser.add_argument("--model", choices=("mlp", "transformer"), default="mlp")
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--depth", type=int, default=depth)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)


def program_arguments(options: argparse.Namespace) -> list[str]:
    """The model options as program.py's command line."""
    return ["--model", options.model, "--width", str(options.width), "--depth", str(options.depth),
            "--batch", str(options.batch), "--steps", str(options.steps)]
