"""trainbase's conformance package: what proves that an image does what its name and its own
manifest (/etc/trainbase/manifest.json) claim, for ANY image that carries a manifest. The checks
are pytest modules in tests/conformance; this package is the plumbing they share:

* `host` -- what this host offers containers (GPU, RDMA devices) and the run options that follow;
* `containers` -- long-running containers to exec into, private networks;
* `flavors` -- how to launch, version-check and read rank variables per MPI kind (from the manifest);
* `layers` -- every layer of an image, streamed (a file deleted later still ships in its layer);
* `azureml` -- the exact environment each Azure ML distribution mode gives each process;
* `runtimes`, `slurm` -- an unprivileged host user, an image unpacked for Charliecloud, and a real
  one-node Slurm (munged, slurmctld, slurmd on loopback) for the runtime tier;
* `results` -- the image x check matrix as Markdown (pytest's own --junitxml is the JUnit).

It imports nothing from the build package (`trainbase`): the engine through
trainbase_common.engine, a build report through trainbase_common.states.
"""

from trainbase_common.manifest import MANIFEST_PATH

__all__ = ["EVIDENCE", "LABEL", "MANIFEST_PATH", "TIERS"]
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
