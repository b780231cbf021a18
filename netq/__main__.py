"""Command line: ``python -m netq`` (or ``netq`` once installed).

One argparse parser with a subcommand per tool, so ``--help`` at every level, ``--version``
and the subcommands' options all come from the same definitions (the demo's live in
:func:`netq.lab.demo.add_arguments`).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import textwrap

from . import __version__


def _prog() -> str:
    # "netq" when run through the installed console script, "python -m netq" otherwise.
    return "netq" if os.path.basename(sys.argv[0] or "") == "netq" else "python -m netq"


def _indented_usage(parser: argparse.ArgumentParser) -> str:
    # argparse's "usage: " prefix replaced by two spaces, continuation lines shifted to match
    prefix = "usage: "
    lines = parser.format_usage().removeprefix(prefix).splitlines()
    shift = len(prefix) - 2
    return "".join([f"  {lines[0]}\n", *(f"{line[shift:]}\n" for line in lines[1:])])


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The whole command line: ``--version`` and one subparser per command."""
    from .lab import demo

    prog = prog or _prog()
    parser = argparse.ArgumentParser(
        prog=prog,
        description=textwrap.fill("netq: put()/get() queues between one server and many "
                                  "clients, over TCP, Unix sockets, MQTT and gRPC.", 78),
        formatter_class=argparse.RawDescriptionHelpFormatter)  # keeps the epilog's lines
    parser.add_argument(
        "--version", action="version",
        version=(f"netq {__version__} (from {os.path.dirname(os.path.abspath(__file__))}, "
                 f"Python {platform.python_version()})"),
        help="print netq's version, where it is installed, and exit")
    commands = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    demo_parser = commands.add_parser("demo", help=demo.SUMMARY, description=demo.DESCRIPTION)
    demo.add_arguments(demo_parser)
    demo_parser.set_defaults(run=demo.command)
    # The top-level help ends with each command's usage line, so both levels list the same
    # options: they are generated from the subparsers themselves.
    usages = "".join(_indented_usage(sub) for sub in commands.choices.values())
    parser.epilog = (f"usage of each command ({prog} COMMAND --help for details):\n{usages}\n"
                     f"Start with: {prog} demo")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
