"""Stage 2, render: the matrix's cells as build files, each with its immutable tag.

Takes the ``Matrix`` and the locks from define/, and templates/ and imagefs/ from the tree.

- context.py: per cell, which building blocks it uses and with what values (plain data: the
  templates' input, the image manifest and the cell's pip lock sets, so they cannot disagree);
- recipes.py: renders images/<cell>/Dockerfile and manifest.json (Jinja2, StrictUndefined),
  hashes everything a build reads into the cell's recipe -- its tag ``r<12 hex>`` -- and
  checks the committed images/ and locks/ for drift (``build.py --render / --check``);
- hadolint.py, pipefail_lint.py: the two lints of what was rendered (``build.py --lint``):
  hadolint, and pipelines that can die of SIGPIPE under pipefail (which also reads the
  repository's own shell).

Hands on ``Rendered`` per cell -- files, recipe, tag, context -- which every later stage
builds, documents and publishes by. Runs nothing and asks no engine.
"""
