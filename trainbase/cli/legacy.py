"""The old action flags (``build.py --render``, ``--matrix``, ``--explain NAME``, ...), kept
working: ``translate`` rewrites such a command line to its subcommand before parser.py parses it,
so there is one parser of record and one place the old spellings live (``OLD_FLAGS``).

- ``--matrix`` becomes ``build`` without a word: it is the documented main command, what the
  workflows and people's scripts call, and a notice in every build log would be noise.
- Every other old flag becomes its subcommand with one line on stderr naming the new form
  (``note: 'build.py --render' is now 'build.py render'``).
- The old parser took every option with every action and ignored what an action did not read
  (``--render --profile local`` rendered everything). The old spelling keeps doing that -- same
  result, same exit code -- and the note names what was ignored; the new spelling refuses it.
- Two actions in one command line (``--render --check``, ``render --check``) are an error, as the
  old mutually exclusive group made them (exit 2).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from .parser import PROG, subparsers


@dataclass(frozen=True)
class OldFlag:
    command: str
    # how many words after the flag are the action's positional value: "" none, "1" exactly one
    # (--explain NAME, --affected REV), "?" one if it is no option (--verify-attestations [REF]),
    # "*" every word up to the next option (--bump [PACKAGE ...])
    value: str = ""
    metavar: str = ""
    notice: bool = True


# old flag -> the subcommand it is now
OLD_FLAGS: dict[str, OldFlag] = {
    "--render": OldFlag("render"),
    "--check": OldFlag("check"),
    "--list": OldFlag("list"),
    "--explain": OldFlag("explain", "1", "NAME"),
    "--lock": OldFlag("lock"),
    "--lock-bases": OldFlag("lock-bases"),
    "--lint": OldFlag("lint"),
    "--matrix": OldFlag("build", notice=False),
    "--prune": OldFlag("prune"),
    "--affected": OldFlag("affected", "1", "REV"),
    "--outdated": OldFlag("outdated"),
    "--bump": OldFlag("bump", "*", "[PACKAGE ...]"),
    "--promote": OldFlag("promote"),
    "--merge-platforms": OldFlag("merge-platforms"),
    "--verify-attestations": OldFlag("verify-attestations", "?", "[REF]"),
    "--catalogue": OldFlag("catalogue"),
    "--ci-matrix": OldFlag("ci-matrix"),
}


class TwoActions(ValueError):
    """A command line naming two actions; the message says which and how to run each."""


@dataclass
class Translated:
    argv: list[str]
    old: str | None = None  # the old flag used, if any
    ignored: list[str] = field(default_factory=list)  # options the old spelling took and its action never read

    def notice(self) -> str | None:
        """The one line for stderr, or None (the new spelling, or a plain --matrix)."""
        if self.old is None:
            return None
        flag = OLD_FLAGS[self.old]
        ignored = f" ({', '.join(self.ignored)}: not read by {flag.command}, ignored as before)" if self.ignored else ""
        if not flag.notice:
            return (
                f"note: 'build.py {self.old}' ignores {', '.join(self.ignored)}: {flag.command} never read it"
                if self.ignored
                else None
            )
        shown = f" {flag.metavar}" if flag.metavar else ""
        return f"note: '{PROG} {self.old}{shown}' is now '{PROG} {flag.command}{shown}'{ignored}"


def _options(p: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in p._actions for s in a.option_strings}


def _value_words(action: argparse.Action | None, rest: list[str]) -> int:
    """How many of ``rest`` are the option's value (its nargs; a word starting with - is none)."""
    if action is None or action.nargs == 0:
        return 0
    if action.nargs in (None, 1):
        return 1 if rest else 0
    if action.nargs == "?":
        return 1 if rest and not rest[0].startswith("-") else 0
    return _leading_words(rest)


def _positional_words(kind: str, rest: list[str]) -> int:
    """How many of ``rest`` an old flag's value takes (OldFlag.value)."""
    if kind == "1":
        return 1 if rest else 0
    if kind == "?":
        return 1 if rest and not rest[0].startswith("-") else 0
    return _leading_words(rest) if kind == "*" else 0


def _leading_words(rest: list[str]) -> int:
    """The words before the next option."""
    n = 0
    while n < len(rest) and not rest[n].startswith("-"):
        n += 1
    return n


def translate(argv: list[str], p: argparse.ArgumentParser) -> Translated:
    """``argv`` in the new form: unchanged when it uses a subcommand (or neither form: argparse
    then says what is missing); the old flag's subcommand first otherwise, its value(s) as the
    subcommand's positional, the options the subcommand does not read dropped."""
    subs = subparsers(p)
    every = {s: a for sp in subs.values() for s, a in _options(sp).items()}
    found: tuple[int, str, list[str]] | None = None  # the old flag: (index, flag, its positional words)
    command: str | None = None
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, value = word.partition("=")
        if name in OLD_FLAGS:
            flag = OLD_FLAGS[name]
            if command is not None:
                raise TwoActions(
                    f"{name} is the old spelling of '{PROG} {flag.command}', and {command} is already "
                    f"the action: give one ('{PROG} {command} --help' lists what {command} reads)"
                )
            if found:
                first = OLD_FLAGS[found[1]].command
                raise TwoActions(
                    f"{found[1]} and {name} are two actions; give one: '{PROG} {first}' or '{PROG} {flag.command}'"
                )
            words = [value] if eq else argv[i + 1 : i + 1 + _positional_words(flag.value, argv[i + 1 :])]
            found = (i, name, words)
            i += 1 + (0 if eq else len(words))
        elif word.startswith("-") and word != "-":
            i += 1 + (0 if eq else _value_words(every.get(name), argv[i + 1 :]))
        else:
            if command is None and not found:
                command = word  # the new form's subcommand; later plain words are its own
            i += 1
    if not found:
        return Translated(list(argv))
    at, flag_name, words = found
    target = OLD_FLAGS[flag_name].command
    reads = _options(subs[target])
    rest = argv[:at] + argv[at + 1 + (0 if "=" in argv[at] else len(words)) :]
    kept: list[str] = []
    ignored: list[str] = []
    i = 0
    while i < len(rest):
        name, eq, _ = rest[i].partition("=")
        n = 1 + (0 if eq else _value_words(every.get(name), rest[i + 1 :]))
        if name.startswith("-") and name not in reads and name in every and name not in ("-h", "--help"):
            ignored.append(name)
        else:
            kept += rest[i : i + n]
        i += n
    return Translated([target, *words, *kept], flag_name, ignored)
