"""The command line of build.py: one subcommand per action (``build.py render``, ``build.py
build``, ``build.py promote``, ...), each reading only the options it lists in its ``--help``.

Takes the command line (old ``--action`` spellings translated first, legacy.py), the matrix file
it names, and each stage's entry point.

- parser.py: the one parser of record -- the subcommands and the options each reads;
- legacy.py: the old action flags (``--render``, ``--matrix``, ...) as one table, each
  translated to its subcommand before parsing;
- actions.py: one function per subcommand, calling into the stage packages;
- printing.py: what the actions print (summaries, the cell table, drift reports);
- cells.py: what ``list`` and ``explain`` say about a cell, and finding one by name;
- main.py: ``main(argv)``, what build.py calls: translate, parse, run, map errors to exit codes.

Hands on the exit code: 0 ok, 1 a check or build failed, 2 bad input, 3 incomplete, 130
interrupted.
"""
