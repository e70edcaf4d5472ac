"""Stage 6, run: ``build.py --matrix`` -- one plan through build, supply chain and delivery.

Not a step of the flow but the one that drives it, so it sits above all of them: for each job,
in dependency order and in parallel up to -j, the base images (build/bases.py), the image's
``docker build`` (build/docker_build.py), then the supply chain (supply/chain.py) before any
child starts FROM it; at the end, with ``--push``, the completed cells are published
(deliver/publish.py). Ctrl-C and SIGTERM stop every build; nothing half-built keeps a tag.

Takes the matrix, the ``Rendered`` cells and the selection, from the command line.

- executor.py: the run itself (scheduling, logs, signals, the order of the steps);
- progress.py: what a person or a CI log sees while it runs;
- report.py: what it ends with -- the summary table, what to do about each failure, and the
  JSON build report the CI fan-out and the conformance suite read.

Hands on the jobs' final states, the report and the exit code.
"""
