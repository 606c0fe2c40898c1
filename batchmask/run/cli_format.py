"""argparse as the `batchmask` command line shows it (batchmask/run/cli.py builds the parser with these):

    Parser      a bad flag is one line through say_error (`batchmask: error: argument --seed: ... (see
                batchmask generate --help)`), exit 2; its subcommands' parsers are Parsers too
    Formatter   every flag's default in --help: `(default: X)` added to a help that does not give it
    Version     --version: the installed distribution's version, from its package metadata
"""
from __future__ import annotations

import argparse

from ..text import say_error


class Formatter(argparse.HelpFormatter):
    """Every flag's default shown: `(default: X)` added to a help that does not say its default itself."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = action.default is None or action.default is False or action.default == argparse.SUPPRESS  # 0 is set
        if unset or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (`batchmask: error: argument --seed: ...`, say_error), exit 2."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)          # the subcommands' parsers too
        super().__init__(*args, **kwargs)

    def error(self, message):
        say_error(f"{message} (see {self.prog} --help)")
        self.exit(2)


class Version(argparse.Action):
    """--version: the installed distribution's version (package metadata), read only when asked for."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from importlib.metadata import PackageNotFoundError, version

        from .. import __version__
        try:
            number = version("batchmask")
        except PackageNotFoundError:          # run from a source tree that was never installed
            number = __version__
        print(f"batchmask {number}")          # on stdout, as argparse's own version action prints
        parser.exit(0)
