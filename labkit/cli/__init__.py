"""``labkit`` command line: one subcommand per module in this package.

Each module ``labkit/cli/<name>.py`` defines ``register(subparsers)``, which adds its subcommand(s)
and sets ``func`` (a callable taking the parsed args and returning an exit code). Modules are
discovered automatically, so adding a command never edits this file.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys


def build_parser() -> argparse.ArgumentParser:
    from labkit._version import __version__

    parser = argparse.ArgumentParser(
        prog="labkit",
        description="Measure, model and diagnose the throughput of LLM training.",
    )
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
