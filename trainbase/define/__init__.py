"""Stage 1, define: what to build, pinned.

Takes matrix.yaml (the one hand-edited input) and the committed locks: locks/<set>.txt, the
hash-pinned pip sets (pip_locks.py), and locks/bases.json, the base image of each OS row by
digest or package list (base_lock.py).

Hands on a checked ``Matrix`` of cells -- each included, or excluded with the rule that says
why -- and the lock formats the renderer folds into every recipe tag. ``build.py --lock``
re-resolves stale pip sets here (pip's resolver, no download); re-locking bases asks the
engine, so it belongs to the build stage (build/bases.py).

Nothing here imports another stage: the rest of trainbase reads what this one declares.
"""
