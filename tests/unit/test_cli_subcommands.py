"""build.py's command line: one subcommand per action, each `--help` listing only the options
that action reads; the old action flags translated to their subcommand with a one-line notice
(`--matrix` without one); two actions, or an option the action does not read, a clear exit 2."""

from __future__ import annotations

import argparse
import ast

import pytest

from trainbase.cli import actions, legacy
from trainbase.cli.main import main, parse
from trainbase.cli.parser import parser, subparsers

from .conftest import ROOT

SUBS = subparsers(parser())


def options(name: str) -> set[str]:
    return {o for a in SUBS[name]._actions for o in a.option_strings} - {"-h", "--help"}


def help_options(name: str, capsys) -> set[str]:
    """The options `build.py NAME --help` prints (its usage line and option list)."""
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    every = {o for n in SUBS for o in options(n)}
    return {o for o in every if any(w.strip("[],") == o for w in text.split())}


# What each action reads: the attributes of args its function (and the stage entry points it hands
# args to) use -- written out, so a new option must be added here, to the parser and to the docs.
READS = {
    "list": {"--file", "--select", "--profile", "--json", "--all"},
    "explain": {"--file"},
    "render": {"--file"},
    "check": {"--file"},
    "lock": {"--file", "--all"},
    "lock-bases": {"--file", "--select", "--profile", "--all"},
    "lint": {"--file", "--select", "--profile"},
    "outdated": {"--file", "--json"},
    "bump": {"--file", "--dry-run"},
    "catalogue": {"--file", "--report", "--junitxml", "--where"},
    "build": {
        "--file",
        "--select",
        "--profile",
        "-j",
        "--jobs",
        "--dry-run",
        "--ca-bundle",
        "--network",
        "--log-dir",
        "--report",
        "--no-cache",
        "--min-free-gb",
        "--test",
        "--push",
        "--registry",
        "--zstd-twin",
        "--sign-key",
        "--supply-dir",
        "--locked",
        "--allowlist",
        "--python-audit",
        "--no-supply",
    },
    "prune": {"--file"},
    "affected": {"--file", "--json"},
    "ci-matrix": {"--file", "--select", "--profile", "--since", "--cover", "--max-levels", "--only", "--registry"},
    "merge-platforms": {"--file", "--select", "--profile", "--registry", "--zstd-twin"},
    "promote": {
        "--file",
        "--select",
        "--profile",
        "--registry",
        "--gate",
        "--head-sha",
        "--recipe-sha",
        "--attested-by",
        "--public-key",
    },
    "verify-attestations": {"--file", "--select", "--profile", "--registry", "--public-key"},
}


def test_every_subcommand_has_one_action_and_every_action_a_subcommand():
    assert set(SUBS) == set(actions.ACTIONS) == set(READS)
    assert {old.command for old in legacy.OLD_FLAGS.values()} == set(SUBS), "an action the old flags cannot reach"


@pytest.mark.parametrize("name", sorted(READS))
def test_each_subcommand_takes_only_the_options_its_action_reads(name):
    assert options(name) == READS[name]


@pytest.mark.parametrize("name", sorted(READS))
def test_each_subcommands_help_lists_only_its_options(name, capsys):
    assert help_options(name, capsys) == READS[name]


def test_each_action_reads_only_what_its_subcommand_parses():
    """The attributes each action function reads of ``args`` exist in its subcommand's namespace
    (an action reading an option its parser lacks would raise AttributeError at run time)."""
    source = ast.parse((ROOT / "trainbase" / "cli" / "actions.py").read_text())
    functions = {f.name: f for f in source.body if isinstance(f, ast.FunctionDef)}
    for name, action in actions.ACTIONS.items():
        namespace = vars(SUBS[name].parse_args(["x"] if name in ("explain", "affected") else []))
        read = {
            n.attr
            for n in ast.walk(functions[action.__name__])
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "args"
        }
        if action.__name__ in (
            "lock_bases",
            "lint",
            "build",
            "ci_matrix",
            "merge_platforms",
            "promote",
            "verify_attestations",
        ):
            read |= {"select", "profile"}  # through actions.selected()
        assert read <= set(namespace), f"{name} reads {sorted(read - set(namespace))}, which it does not parse"


def test_top_level_help_lists_every_command_and_no_action_option(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert all(name in out for name in SUBS)
    assert "--select" not in out and "--registry" not in out and "--jobs" not in out
    assert "--render" in out and "--matrix" in out  # the old spellings are named


# --------------------------------------------------------------------------- the old spellings

OLD_FORMS = [
    (["--render"], ["render"]),
    (["--check", "--file", "m.yaml"], ["check", "--file", "m.yaml"]),
    (
        ["--file", "m.yaml", "--ci-matrix", "--profile", "local"],
        ["ci-matrix", "--file", "m.yaml", "--profile", "local"],
    ),
    (["--list", "--json", "--all"], ["list", "--json", "--all"]),
    (["--explain", "NAME", "--file", "m.yaml"], ["explain", "NAME", "--file", "m.yaml"]),
    (["--explain=NAME"], ["explain", "NAME"]),
    (["--lock", "--all"], ["lock", "--all"]),
    (["--lock-bases", "--all", "--select", "os=debian12"], ["lock-bases", "--all", "--select", "os=debian12"]),
    (["--lint"], ["lint"]),
    (["--prune"], ["prune"]),
    (["--affected", "origin/main", "--json"], ["affected", "origin/main", "--json"]),
    (["--outdated", "--json"], ["outdated", "--json"]),
    (["--bump"], ["bump"]),
    (["--bump", "torch", "deepspeed", "--dry-run"], ["bump", "torch", "deepspeed", "--dry-run"]),
    (["--promote", "--registry", "r/ns", "--gate", "gate/"], ["promote", "--registry", "r/ns", "--gate", "gate/"]),
    (
        ["--merge-platforms", "--zstd-twin", "--registry", "r/ns"],
        ["merge-platforms", "--zstd-twin", "--registry", "r/ns"],
    ),
    (["--verify-attestations"], ["verify-attestations"]),
    (
        ["--verify-attestations", "h/r:t", "--public-key", "k.pem"],
        ["verify-attestations", "h/r:t", "--public-key", "k.pem"],
    ),
    (["--catalogue", "--report", "b.json", "--where", "here"], ["catalogue", "--report", "b.json", "--where", "here"]),
    (
        ["--matrix", "--profile", "local", "-j", "4", "--push", "stage", "--registry", "r/ns"],
        ["build", "--profile", "local", "-j", "4", "--push", "stage", "--registry", "r/ns"],
    ),
    (["--select", "name=x", "--matrix", "--dry-run"], ["build", "--select", "name=x", "--dry-run"]),
]


def test_every_old_flag_has_a_case_here():
    assert {next(w.split("=")[0] for w in old if w.split("=")[0] in legacy.OLD_FLAGS) for old, _ in OLD_FORMS} == set(
        legacy.OLD_FLAGS
    )


@pytest.mark.parametrize("old, new", OLD_FORMS, ids=lambda v: " ".join(v))
def test_an_old_flag_becomes_its_subcommand_and_parses_as_the_new_form_does(old, new):
    t = legacy.translate(old, parser())
    assert t.argv == new and not t.ignored
    assert vars(parse(old)) == vars(parse(new))


@pytest.mark.parametrize(
    "old, new", [c for c in OLD_FORMS if c[0][0] != "--matrix" and "--matrix" not in c[0]], ids=lambda v: " ".join(v)
)
def test_an_old_flag_prints_one_line_naming_the_new_form(old, new, capsys):
    parse(old)
    err = capsys.readouterr().err
    flag = next(w.split("=")[0] for w in old if w.split("=")[0] in legacy.OLD_FLAGS)
    assert (
        err.count("\n") == 1
        and err.startswith(f"note: 'build.py {flag}")
        and f"is now 'build.py {legacy.OLD_FLAGS[flag].command}" in err
    ), err
    parse(new)
    assert capsys.readouterr().err == "", "the new form prints no note"


def test_matrix_keeps_working_as_documented_without_a_note(capsys):
    """`python build.py --matrix ...` is what people and the workflows call: the same build,
    and nothing on stderr."""
    documented = ["--matrix", "--select", "name=$CELL", "--push", "stage", "--zstd-twin", "--registry", "r/ns"]
    args = parse(documented)
    assert args.command == "build" and args.push == "stage" and args.zstd_twin and args.registry == "r/ns"
    assert capsys.readouterr().err == ""
    assert vars(args) == vars(parse(["build", *documented[1:]]))


def test_matrix_end_to_end_dry_run_exits_as_build_does(capsys, monkeypatch):
    from trainbase.run import executor

    monkeypatch.setattr(executor.Executor, "run", lambda self: 0)
    cell = "openmpi5.0.11-cuda13.0-cudnn9-debian12"
    old = main(["--matrix", "--select", f"name={cell}", "--dry-run", "--no-supply"])
    old_out = capsys.readouterr()
    new = main(["build", "--select", f"name={cell}", "--dry-run", "--no-supply"])
    assert old == new and old_out.out == capsys.readouterr().out
    assert "note:" not in old_out.err


def test_an_old_flag_ignores_what_its_action_never_read_and_says_so(capsys):
    """The old parser took every option with every action: `--render --profile local` rendered
    everything, exit 0. The old spelling still does (same exit code), and the note names it."""
    t = legacy.translate(["--render", "--profile", "local", "--select", "os=debian12"], parser())
    assert t.argv == ["render"] and t.ignored == ["--profile", "--select"]
    assert "--profile, --select: not read by render, ignored as before" in (t.notice() or "")
    args = parse(["--render", "--profile", "local"])
    assert args.command == "render"
    assert capsys.readouterr().err.count("\n") == 1


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["--render", "--check"],
            "--render and --check are two actions; give one: 'build.py render' or 'build.py check'",
        ),
        (["render", "--check"], "--check is the old spelling of 'build.py check', and render is already the action"),
        (["--list", "--explain", "x"], "--list and --explain are two actions"),
        (
            ["render", "--profile", "local"],
            "render does not read --profile (--profile is an option of: list, lock-bases",
        ),
        (["list", "--push"], "list does not read --push (--push is an option of: build)"),
        (["build", "--dryrun"], "unrecognized arguments for build: --dryrun"),
        (["explain"], "the following arguments are required: NAME"),
        (["affected"], "the following arguments are required: REV"),
        ([], "the following arguments are required: COMMAND"),
        (["--nonsense"], "the following arguments are required: COMMAND"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_a_bad_command_line_exits_2_saying_why(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_the_exit_codes_are_unchanged(capsys):
    """2 for a name no combination has (old spelling and new), 0 for a found one."""
    assert main(["--explain", "nonsense-cuda99"]) == 2
    assert main(["explain", "nonsense-cuda99"]) == 2
    assert main(["list", "--profile", "local"]) == 0
    assert main(["--list", "--profile", "local"]) == 0


def test_the_subcommands_are_parsed_by_one_parser_of_record():
    """build.py, the docs tests and legacy.py all use parser.parser(); no other ArgumentParser in
    the command line package."""
    for path in (ROOT / "trainbase" / "cli").glob("*.py"):
        calls = [
            n
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "ArgumentParser"
        ]
        assert not calls or path.name == "parser.py", path
    assert isinstance(parser(), argparse.ArgumentParser)
