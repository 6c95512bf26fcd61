"""A `help-text` directive: a command's --help, generated from its argparse parser at build time.

    ```{help-text} tarantella.launcher.cli:build_parser
    ```

The page shows what `--help` prints (80 columns), and for a parser with subcommands each subcommand's too,
so the manual cannot drift from the tools.
"""
from __future__ import annotations

import argparse
import importlib
import os

from docutils import nodes
from docutils.parsers.rst import Directive

WIDTH = "80"


def _help_texts(parser: argparse.ArgumentParser) -> list[tuple[str, str]]:
    texts = [(parser.prog, parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                texts.append((f"{parser.prog} {name}", sub.format_help()))
    return texts


class HelpText(Directive):
    required_arguments = 1

    def run(self):
        module_name, function = self.arguments[0].split(":")
        saved = os.environ.get("COLUMNS")
        os.environ["COLUMNS"] = WIDTH          # argparse wraps to $COLUMNS
        try:
            parser = getattr(importlib.import_module(module_name), function)()
            texts = _help_texts(parser)
        finally:
            if saved is None:
                os.environ.pop("COLUMNS", None)
            else:
                os.environ["COLUMNS"] = saved
        found = []
        for prog, text in texts:
            command = f"{prog} --help"
            found.append(nodes.paragraph("", "", nodes.literal(command, command)))
            found.append(nodes.literal_block(text, text))
        return found


def setup(app):
    app.add_directive("help-text", HelpText)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
