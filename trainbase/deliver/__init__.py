"""Stage 5, deliver: built images to a registry, and the CI jobs that build and test them.

Takes the plan's ``Job``s (build/) whose build and supply chain completed, and the
``Rendered`` tags (render/).

- registry.py: the registry asked with the user's ``docker login`` credentials -- present,
  absent, or an error that says how to log in; never a guess;
- publish.py: ``--push``: immutable tags only, never overwritten (staging); a failed cell,
  and every cell built on it, publishes nothing;
- promote.py: ``--promote``: the moving alias retagged registry side, by digest, to each
  cell's current recipe tag where the gate (GPU tier) passed it; revert-safe;
- affected.py: which cells a change since a revision rebuilds or re-tests (each cell's tag at
  both revisions compared);
- platforms.py: which selected cells a repository publishes and under which release tag (a
  refused platform is in none), asked by the plan, the merge, promotion, mirrors and
  attestation checks alike; ``--merge-platforms``;
- ci_matrix.py: the CI job matrix by FROM level, optionally only the affected cells, a cover
  of every axis value, or what the registry has or lacks;
- runners.py: the build runner of each planned cell (GitHub-hosted only for a pull request),
  and the check that no pull request reaches a self-hosted job in the workflows.
- ci_gate.py: ``build.yml``'s first job: publish only a commit whose ci.yml push run passed;
- refresh_patch.py: the refresh proposal's allow-list (matrix.yaml, locks/, images/): every
  other path of the patch refused by name before the write job applies anything.

Hands on published tags (with their digests) and ``KEY=JSON`` lines for GitHub Actions.
"""
