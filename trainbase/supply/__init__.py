"""Stage 4, supply chain: what each built image has, whether it may keep its tag, and what
changed since its last build.

Takes a built ``Job`` (build/) and the image under its tag, the base the build recorded
(build/bases.py) and the cell's pinned downloads (render/).

- inventory.py: the ``Inventory`` record -- OS packages, Python distributions, components
  trainbase built or ships, the base -- what an image has, not what its manifest claims;
- inventory_reader.py: reads that record out of a built image, in one throwaway container;
- sbom.py: the inventory as a reproducible CycloneDX SBOM;
- audit.py, budget.py: the gates -- known vulnerabilities against audit-allowlist.yaml, size
  and wasted bytes against the manifest's budget;
- release_notes.py: what changed between this build's inventory and the previous one's;
- chain.py: the step the executor runs after every build: all of the above, the input lock
  ``--locked`` rebuilds against, and the SBOM attached to the image as a file and a label.

Hands on per cell and tag: inputs.lock.json, inventory.json, sbom.cdx.json, audit.json,
budget.json, release-notes.md -- and a verdict: a failed gate fails the cell and removes its
tag, so nothing unaudited or over budget reaches delivery.
"""
