"""``main(argv)``: what build.py calls. Old spellings translated (legacy.py), the one parser
(parser.py), the subcommand's action (actions.py); a TrainbaseError becomes its one-line message
and exit code, Ctrl-C 130, a closed pipe 141 -- never a traceback."""

from __future__ import annotations

import argparse
import errno
import os
import sys

from trainbase_common.safe_io import InputError

from ..define.matrix import load
from ..errors import TrainbaseError
from ..run import signals
from . import checkout_lock, legacy
from .actions import ACTIONS
from .parser import PROG, parser, subparsers


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line as the subcommand's options; argparse's usage and exit 2 for a bad one."""
    p = parser()
    words = sys.argv[1:] if argv is None else list(argv)
    try:
        translated = legacy.translate(words, p)
    except legacy.TwoActions as e:
        p.error(str(e))
    if note := translated.notice():
        print(note, file=sys.stderr)
    args, extra = p.parse_known_args(translated.argv)
    if extra:  # argparse would say only "unrecognized arguments"; say whose options they are
        sub = subparsers(p)
        unread = [w for w in extra if w.startswith("-")] or extra
        takers = [
            name
            for name, sp in sub.items()
            if unread[0].split("=")[0] in {s for a in sp._actions for s in a.option_strings}
        ]
        if takers:
            why = f"{args.command} does not read {' '.join(unread)} ({unread[0]} is an option of: {', '.join(takers)})"
        else:
            why = f"unrecognized arguments for {args.command}: {' '.join(extra)}"
        sub[args.command].error(f"{why}; `{PROG} {args.command} --help` lists what it reads")
    return args


DISK_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EACCES, errno.ENAMETOOLONG}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    args.argv = argv  # what the checkout lock says the holder runs
    try:
        with signals.as_interrupt():
            return run(args)
    except TrainbaseError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    except InputError as e:  # a record another run wrote (a report, a lock) that cannot be read: it names the file
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (signals.Stopped) where no stage handled it
        print(f"interrupted ({signals.name_of(e)})", file=sys.stderr)
        return signals.exit_code(e)
    except BrokenPipeError:  # `build.py list | head`: the reader left; no traceback (Python's docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        if e.errno not in DISK_ERRORS:
            raise
        # a full disk or a read-only tree: one line; what was being written kept its old content (safe_io)
        print(f"error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    m = load(args.file)
    root = m.path.resolve().parent
    if args.command not in checkout_lock.WRITERS or getattr(args, "dry_run", False):
        return ACTIONS[args.command](m, root, args)
    with checkout_lock.hold(root, [PROG, *(sys.argv[1:] if getattr(args, "argv", None) is None else args.argv)]):
        return ACTIONS[args.command](m, root, args)
