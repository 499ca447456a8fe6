"""``labkit`` command line: one subcommand per module in this package.

Each module ``labkit/cli/<name>.py`` defines ``register(subparsers)``, which adds its subcommand(s)
and sets ``func`` (a callable taking the parsed args and returning an exit code). Modules are
discovered automatically, so adding a command never edits this file (``_``-prefixed modules, like
``_io``, are helpers, not commands).

One error boundary (:func:`main`): any exception from bad input — an unreadable or wrong file, a bad
value — is printed as one line, ``labkit <command>: error: <what, naming the file or parameter>``,
with exit code 2; ``labkit --debug <command>`` (or ``LABKIT_DEBUG=1``) shows the traceback instead.
Ctrl-C exits 130 without a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys

from labkit.cli._io import BAD_INPUT, describe


def build_parser() -> argparse.ArgumentParser:
    from labkit._version import __version__

    parser = argparse.ArgumentParser(
        prog="labkit",
        description="Measure, model and diagnose the throughput of LLM training.",
    )
    parser.add_argument("--version", action="version", version=f"labkit {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback of an error instead of one line (also: LABKIT_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(sub)
    return parser


def _prog(args) -> str:
    """``labkit comm parse``: the command and its action, for the error line."""
    words = [args.command] + [v for k, v in sorted(vars(args).items())
                              if k.endswith("_command") and isinstance(v, str)]
    return "labkit " + " ".join(words)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    debug = args.debug or os.environ.get("LABKIT_DEBUG", "") not in ("", "0")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{_prog(args)}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:                  # the reader of our output went away (| head): nothing to say
        try:
            sys.stdout = open(os.devnull, "w")   # noqa: SIM115 - so the interpreter's final flush is quiet
        except OSError:
            pass
        return 141
    except BAD_INPUT as e:
        if debug:
            raise
        print(f"{_prog(args)}: error: {describe(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
