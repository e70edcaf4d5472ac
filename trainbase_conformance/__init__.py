"""trainbase's conformance suite, installable on its own (the `trainbase-conformance` wheel):
what proves that an image does what its name and its own manifest (/etc/trainbase/manifest.json)
claim -- or, for an image trainbase did not build, what its user's expectations file claims.
The checks are the pytest modules in `checks/`, `plugin` is the pytest plugin that gives them
their images, containers, tiers and reports (the entry point; its parts: `options`, `collection`
-- which checks run on which image, in which order, skipped why --, `fixtures` -- `target`,
`cluster` and what a check imports from there --, `reporting`, with `session` holding what they
share), `cli` the console command; the rest is the plumbing they share:

* `host` -- what this host offers containers (GPU, RDMA devices) and the run options that follow;
* `containers` -- long-running containers to exec into, private networks;
* `flavors` -- how to launch, version-check and read rank variables per MPI kind (from the manifest);
* `layers` -- every layer of an image, streamed (a file deleted later still ships in its layer);
* `azureml` -- the exact environment each Azure ML distribution mode gives each process;
* `runtimes`, `slurm` -- an unprivileged host user, an image unpacked for Charliecloud, and a real
  one-node Slurm (munged, slurmctld, slurmd on loopback) for the runtime tier;
* `results` -- the image x check matrix as Markdown (pytest's own --junitxml is the JUnit);
* `expectations` -- an image without a manifest described by a small validated file;
* `resources` -- probes, schema and examples, found alike in a checkout and in the wheel.

It imports nothing from the build package (`trainbase`): the engine through
trainbase_common.engine, a build report through trainbase_common.states.
"""

from trainbase_common.manifest import MANIFEST_PATH

__all__ = ["EVIDENCE", "LABEL", "MANIFEST_PATH", "MARKERS", "TIERS"]
LABEL = "io.trainbase.conformance"  # put on every container/network/image the suite makes
TIERS = ("static", "cpu", "multinode", "azureml", "runtime", "gpu", "fabric")
# What a check proves, declared by each test with ``@pytest.mark.evidence(KIND)``. A check that
# could load or run the thing but only looks for it ("presence") lets through images whose file
# is there and broken (UCX's IB module deleted, a truncated provider, a tool missing its
# library): the report prints their share so it only goes down.
EVIDENCE = {
    "run": "runs the thing and checks what it computed or printed",
    "load": "loads the thing (dlopen, import, component open) and queries it",
    "content": "reads what the image carries (layers, labels, manifest, environment) where nothing runs",
    "presence": "only looks for a file, a path, a listing or build-time configuration",
}

# The markers the checks use, registered by the plugin (an installed suite has no pyproject).
MARKERS = {
    "static": "files, libraries, versions, labels (no process started beyond the container)",
    "cpu": "runs things in the image with no GPU and no RDMA device (the default tier)",
    "multinode": "several containers on a private docker network",
    "azureml": "every Azure ML distribution mode's exact per-process environment on 2 containers x 2 processes",
    "runtime": "the image as clusters start it: a uid without passwd entry, read-only roots, Charliecloud as "
    "a user (bare and --set-env), rootless Podman, a real one-node Slurm with srun "
    "--mpi=none/pmi2/pmix through ch-run",
    "gpu": "needs an NVIDIA GPU (runs on GPU runners)",
    "fabric": "needs real RDMA devices (/dev/infiniband)",
    "apptainer": "runtime-tier cases through Apptainer (exec, --cleanenv, srun with and without --sharens); "
    "for runners that have it",
    "enroot": "runtime-tier cases through enroot (start, srun one container per task as pyxis does); "
    "for runners that have it",
    "native_only(why)": "cannot run under qemu emulation (timings, ptrace, CPU probes): skipped on an image of "
    "another architecture than the host's, saying so (emulation.py)",
    "evidence(kind)": "what a check proves: run, load, content or presence (EVIDENCE)",
    "trainbase_contract(what)": "checks trainbase's own tools or metadata (tb-doctor, tb-launch, labels, "
    "SBOM, the manifest's extra fields): skipped on an image trainbase did not build",
}
