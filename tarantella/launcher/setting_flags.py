"""Launcher flags made from the table of runtime settings (tarantella/config.py).

Every `Setting` with a flag becomes one option of `tarantella`; its name, default,
unit, meaning and variable come from the table and are declared nowhere else.
The value each rank receives is resolved once, here, in this order:

    1. the flag on the command line            (--fusion-threshold 64)
    2. -x VARIABLE=VALUE on the command line   (-x TNT_FUSION_THRESHOLD_KB=64)
    3. the variable in the launcher's environment
    4. the default in the table

and validated with the setting's own parser, so a bad value stops the launch
instead of every rank.
"""
from __future__ import annotations

import argparse
import textwrap
from typing import Mapping

from tarantella.config import SETTINGS, Setting

__all__ = ["add_setting_flags", "resolve_setting_env", "settings_manual", "SettingValueError"]


class SettingValueError(ValueError):
    pass


def _dest(setting: Setting) -> str:
    return "setting_" + setting.name


def _format(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _describe_default(setting: Setting) -> str:
    if setting.flag_is_switch:
        return "off"
    unit = f" {setting.unit}" if setting.unit else ""
    return f"{setting.default}{unit}"


def _flag_help(setting: Setting) -> str:
    unit = f"; unit: {setting.unit}" if setting.unit and not setting.flag_is_switch else ""
    return (f"{setting.help} (default: {_describe_default(setting)}{unit}; "
            f"sets {setting.env} on every rank)").replace("%", "%%")


def _argparse_type(setting: Setting):
    def convert(text: str):
        try:
            setting.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"{error}") from None
        return text
    convert.__name__ = setting.name  # argparse names the type in some messages
    return convert


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "runtime settings",
        "Made from the table in tarantella/config.py; each sets its variable on every rank.")
    for setting in SETTINGS:
        if not setting.flag:
            continue
        if setting.flag_is_switch:
            group.add_argument(setting.flag, dest=_dest(setting), action="store_true",
                               default=None, help=_flag_help(setting))
        else:
            group.add_argument(setting.flag, dest=_dest(setting), default=None,
                               metavar=setting.name.upper(), type=_argparse_type(setting),
                               help=_flag_help(setting))


def resolve_setting_env(args: argparse.Namespace, exported: Mapping[str, str],
                        environ: Mapping[str, str]) -> dict[str, str]:
    """The value of every setting's variable for the ranks (see the module docstring)."""
    resolved = {}
    for setting in SETTINGS:
        given = getattr(args, _dest(setting), None) if setting.flag else None
        if given is not None:
            raw, origin = ("1" if given is True else given), setting.flag
        elif setting.env in exported:
            raw, origin = exported[setting.env], f"-x {setting.env}"
        elif setting.env in environ:
            raw, origin = environ[setting.env], f"{setting.env} in the environment"
        else:
            resolved[setting.env] = _format(setting.default)
            continue
        try:
            value = setting.parse(raw)
        except ValueError as error:
            raise SettingValueError(
                f"{origin}={raw!r} is invalid: {error} ({setting.help})") from None
        resolved[setting.env] = _format(value)
    return resolved


def settings_manual(width: int = 88) -> str:
    """The runtime settings, one paragraph each, for the manual."""
    paragraphs = []
    for setting in SETTINGS:
        flag = setting.flag or "(no flag)"
        if setting.flag and not setting.flag_is_switch:
            flag += f" {setting.name.upper()}"
        text = f"{setting.help} (default {_describe_default(setting)}; sets {setting.env})"
        paragraphs.append(f"  {flag}\n" + textwrap.fill(
            text, width, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(paragraphs)
