"""The Kubernetes manifests under examples/ (examples/kubernetes/*.yaml, examples/doctor/mpijob.yaml),
checked without a cluster:

- core objects by the Kubernetes Python client's own models (`kubernetes`, requirements-dev.txt):
  every pod template inside a job is deserialized as a V1PodTemplateSpec, which must keep every
  field the file gives (the client drops a key it does not know, so a misspelt or misplaced field
  shows up as lost) and have the client's required ones (a container's name, ...); the ConfigMap
  the file's own `kubectl create configmap` line makes is deserialized as a V1ConfigMap;
- the Kubeflow resources (MPIJob kubeflow.org/v2beta1, PyTorchJob kubeflow.org/v1) against a small
  JSON schema of what their operators refuse, written from the MPI Operator's validation
  (pkg/apis/kubeflow/validation) and the Training Operator's PyTorchJob webhook: the replica
  types, one launcher / one master, the `pytorch` container, restart and clean-pod policies,
  the fields their CRDs declare (kubectl's default strict field validation refuses others);
- what makes the job run as written: every volume mount names a volume of its pod, every
  container has an image, a script the command runs is mounted from a ConfigMap that the
  documented command fills with that file; MPIJob: ranks = workers x slots, one GPU a slot, ranks
  placed in blocks, the hostfile and MASTER_ADDR taken from what the operator mounts; PyTorchJob:
  torchrun with nprocPerNode = the GPUs of a pod.

Each check is also run on a planted defect, which it must report."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from .conftest import ROOT

kubernetes = pytest.importorskip(
    "kubernetes", reason="kubernetes is not installed: `pip install -r requirements-dev.txt`"
)

EXAMPLES = ROOT / "examples"
MANIFESTS = sorted(p for p in EXAMPLES.rglob("*.yaml") if "kind:" in p.read_text())

# --------------------------------------------------------------------------- the Kubeflow schemas

DNS1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


def replica(restart_policies: list[str], **replicas) -> dict:
    return {
        "type": "object",
        "required": ["template"],
        "additionalProperties": False,
        "properties": {
            "replicas": {"type": "integer", **replicas},
            "restartPolicy": {"enum": restart_policies},
            # a replica without containers is refused; its inside is a core
            # V1PodTemplateSpec, checked by the client's model
            "template": {
                "type": "object",
                "required": ["spec"],
                "properties": {"spec": {"type": "object", "required": ["containers"]}},
            },
        },
    }


RUN_POLICY = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "cleanPodPolicy": {"enum": ["None", "Running", "All"]},
        "backoffLimit": {"type": "integer", "minimum": 0},
        "activeDeadlineSeconds": {"type": "integer", "minimum": 0},
        "ttlSecondsAfterFinished": {"type": "integer", "minimum": 0},
        "suspend": {"type": "boolean"},
        "managedBy": {"type": "string"},
        "schedulingPolicy": {"type": "object"},
    },
}


def resource(api_version: str, kind: str, spec: dict) -> dict:
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": api_version},
            "kind": {"const": kind},
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string", "pattern": DNS1035, "maxLength": 50}},
            },
            "spec": spec,
        },
    }


MPIJOB = resource(
    "kubeflow.org/v2beta1",
    "MPIJob",
    {
        "type": "object",
        "required": ["mpiReplicaSpecs"],
        "additionalProperties": False,
        "properties": {
            "slotsPerWorker": {"type": "integer", "minimum": 0},
            "runPolicy": RUN_POLICY,
            "sshAuthMountPath": {"type": "string"},
            "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
            "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
            "runLauncherAsWorker": {"type": "boolean"},
            "mpiReplicaSpecs": {
                "type": "object",
                "required": ["Launcher"],
                "additionalProperties": False,
                "properties": {
                    "Launcher": replica(["Never", "OnFailure"], const=1),
                    "Worker": replica(["Never", "OnFailure"], minimum=1),
                },
            },
        },
    },
)

PYTORCH_CONTAINERS = {
    "type": "array",
    "minItems": 1,
    "items": {"type": "object", "required": ["image"]},
    "contains": {"type": "object", "properties": {"name": {"const": "pytorch"}}, "required": ["name"]},
}


def pytorch_replica(**replicas) -> dict:
    r = replica(["Always", "OnFailure", "Never", "ExitCode"], **replicas)
    r["properties"]["template"]["properties"]["spec"]["properties"] = {"containers": PYTORCH_CONTAINERS}
    return r


PYTORCHJOB = resource(
    "kubeflow.org/v1",
    "PyTorchJob",
    {
        "type": "object",
        "required": ["pytorchReplicaSpecs"],
        "additionalProperties": False,
        "properties": {
            "nprocPerNode": {"type": "string"},
            "runPolicy": RUN_POLICY,
            "elasticPolicy": {"type": "object"},
            "pytorchReplicaSpecs": {
                "type": "object",
                "minProperties": 1,
                "additionalProperties": False,
                "properties": {"Master": pytorch_replica(const=1), "Worker": pytorch_replica(minimum=1)},
            },
        },
    },
)

SCHEMAS = {
    ("kubeflow.org/v2beta1", "MPIJob"): (MPIJOB, "mpiReplicaSpecs"),
    ("kubeflow.org/v1", "PyTorchJob"): (PYTORCHJOB, "pytorchReplicaSpecs"),
}

# --------------------------------------------------------------------------- core objects


def deserialize(obj: dict, klass: str):
    """obj as the Kubernetes client reads an API answer of type klass (its own models)."""

    class Answer:
        data = json.dumps(obj)

    return kubernetes.client.ApiClient().deserialize(Answer(), klass)


def leaves(obj, path="") -> dict[str, str]:
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in leaves(val, f"{path}.{key}").items()}
    if isinstance(obj, list):
        return {k: v for i, val in enumerate(obj) for k, v in leaves(val, f"{path}[{i}]").items()}
    return {path: str(obj)}


def core_problems(obj: dict, klass: str, where: str) -> list[str]:
    """What the client's model of klass refuses, or drops (a field it does not know)."""
    try:
        model = deserialize(obj, klass)
    except (ValueError, TypeError) as e:
        return [f"{where}: not a valid {klass}: {e}"]
    kept = leaves(kubernetes.client.ApiClient().sanitize_for_serialization(model))
    return [
        f"{where}{path}: no such field of {klass} (the client dropped it)"
        for path, value in leaves(obj).items()
        if kept.get(path) != value
    ]


KUBECTL_CONFIGMAP = re.compile(r"kubectl create configmap (\S+)((?:\s+--from-file=\S+)+)")


def configmaps(text: str) -> tuple[dict[str, dict], list[str]]:
    """The ConfigMaps the file's `kubectl create configmap NAME --from-file=PATH` lines make (from
    the checkout's root), as V1ConfigMap objects: name -> data."""
    made, problems = {}, []
    for m in KUBECTL_CONFIGMAP.finditer(text):
        name, files = m.group(1), [f.split("=", 1)[1] for f in m.group(2).split()]
        missing = [f for f in files if not (ROOT / f).is_file()]
        if missing:
            problems.append(f"kubectl create configmap {name}: no such file {', '.join(missing)}")
            continue
        obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name},
            "data": {Path(f).name: (ROOT / f).read_text() for f in files},
        }
        problems += core_problems(obj, "V1ConfigMap", f"ConfigMap {name}")
        made[name] = obj["data"]
    return made, problems


# --------------------------------------------------------------------------- the checks


def pod_templates(job: dict) -> dict[str, dict]:
    key = SCHEMAS[(job.get("apiVersion"), job.get("kind"))][1]
    return {rtype: spec.get("template", {}) for rtype, spec in job["spec"].get(key, {}).items()}


def command_of(container: dict) -> str:
    return " ".join(container.get("command", []) + container.get("args", []))


def scripts_run(command: str) -> list[str]:
    return re.findall(r"(?<![\w.-])(/[\w./-]+\.py)\b", command)


def script_problems(where: str, command: str, pod: dict, made: dict[str, dict]) -> list[str]:
    """Each script the command runs must be in the pod, mounted from a ConfigMap holding it."""
    problems = []
    volumes = {v.get("name"): v for v in pod.get("spec", {}).get("volumes", [])}
    mounts = [m for c in pod.get("spec", {}).get("containers", []) for m in c.get("volumeMounts", [])]
    for script in scripts_run(command):
        mount = next((m for m in mounts if script.startswith(m.get("mountPath", "").rstrip("/") + "/")), None)
        if mount is None:
            problems.append(f"{where}: runs {script}, which no volume mounts (no image contains it)")
            continue
        if mount.get("name") not in volumes:
            continue  # pod_problems says so
        cm = volumes[mount["name"]].get("configMap", {}).get("name")
        key = script[len(mount["mountPath"].rstrip("/")) + 1 :]
        if cm is None:
            problems.append(
                f"{where}: {script} is mounted from volume {mount['name']!r}, not a ConfigMap the example makes"
            )
        elif cm not in made:
            problems.append(
                f"{where}: {script} comes from ConfigMap {cm!r}, which no `kubectl create configmap` line makes"
            )
        elif key not in made[cm]:
            problems.append(f"{where}: {script}: ConfigMap {cm!r} as the file's kubectl line makes it has no {key!r}")
    return problems


def pod_problems(where: str, pod: dict) -> list[str]:
    spec = pod.get("spec", {})
    volumes = {v.get("name") for v in spec.get("volumes", [])}
    problems = []
    for c in spec.get("containers", []):
        if not c.get("image"):
            problems.append(f"{where}: container {c.get('name')!r} has no image")
        for m in c.get("volumeMounts", []):
            if m.get("name") not in volumes:
                problems.append(
                    f"{where}: container {c.get('name')!r} mounts volume {m.get('name')!r}, which the pod does not have"
                )
    return problems


def gpus(pod: dict) -> int:
    return sum(
        int(c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))
        for c in pod.get("spec", {}).get("containers", [])
    )


def mpirun_argv(command: list[str]) -> tuple[list[str], str]:
    """The launcher's mpirun command line, and the shell before it (`sh -c "...; exec mpirun ..."`)."""
    if command[:2] != ["sh", "-c"]:
        return command, ""
    before, _, rest = command[2].partition("exec mpirun ")
    return (["mpirun", *shlex.split(rest)] if rest else []), before


def option(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


def mpijob_problems(job: dict, made: dict[str, dict]) -> list[str]:
    spec, problems = job["spec"], []
    launcher = pod_templates(job)["Launcher"]["spec"]["containers"][0]
    argv, before = mpirun_argv(launcher.get("command", []))
    if not argv:
        return ["Launcher: the command is not mpirun (or `sh -c '... exec mpirun ...'`)"]
    workers = spec["mpiReplicaSpecs"].get("Worker", {})
    slots, nodes = spec.get("slotsPerWorker", 1), workers.get("replicas", 0)
    if option(argv, "-np") != str(slots * nodes):
        problems.append(
            f"Launcher: mpirun -np {option(argv, '-np')}, but {nodes} workers x {slots} slots = {slots * nodes} ranks"
        )
    if option(argv, "--map-by") != f"ppr:{slots}:node":
        problems.append(
            f"Launcher: ranks must be placed in blocks of {slots} a node (--map-by ppr:{slots}:node), "
            "or tb-launch cannot derive NODE_RANK"
        )
    if option(argv, "--hostfile") != "/etc/mpi/hostfile":
        problems.append(
            "Launcher: mpirun must be given the hostfile the operator mounts (--hostfile /etc/mpi/hostfile)"
        )
    # worker 0's DNS name depends on the operator's version (service `<job>` from 0.5, `<job>-worker`
    # before): it is read from the hostfile, never written out
    if "tb-launch" in argv and not (
        "read -r MASTER_ADDR _ < /etc/mpi/hostfile" in before and option(argv, "-x") == "MASTER_ADDR"
    ):
        problems.append(
            "Launcher: MASTER_ADDR must be the first host of /etc/mpi/hostfile, exported to the ranks (-x MASTER_ADDR)"
        )
    worker_pod = workers.get("template", {})
    if gpus(worker_pod) and gpus(worker_pod) != slots:
        problems.append(f"Worker: {gpus(worker_pod)} GPUs a pod but {slots} slots (ranks) a worker")
    # the ranks run on the workers: what they run must be there
    problems += script_problems("Worker", " ".join(argv), worker_pod, made)
    return problems


def pytorchjob_problems(job: dict, made: dict[str, dict]) -> list[str]:
    problems = []
    nproc = job["spec"].get("nprocPerNode")
    for rtype, pod in pod_templates(job).items():
        c = next((c for c in pod["spec"]["containers"] if c.get("name") == "pytorch"), None)
        if c is None:
            continue  # the schema says so
        command = command_of(c)
        if not re.match(r"(\S*/)?torchrun\b", command):
            problems.append(f"{rtype}: the command is not torchrun: one process a pod would use one GPU of {gpus(pod)}")
        if gpus(pod) and nproc != str(gpus(pod)):
            problems.append(f"{rtype}: nprocPerNode {nproc!r}, but {gpus(pod)} GPUs a pod")
        problems += script_problems(rtype, command, pod, made)
    return problems


KIND_CHECKS = {"MPIJob": mpijob_problems, "PyTorchJob": pytorchjob_problems}


def schema_message(e: jsonschema.ValidationError) -> str:
    if e.validator == "contains":  # jsonschema would print the whole container list
        return f"no container is named {e.validator_value['properties']['name']['const']!r} (the operator requires one)"
    return e.message


def manifest_problems(text: str) -> list[str]:
    made, problems = configmaps(text)
    for job in yaml.safe_load_all(text):
        kind = (job.get("apiVersion"), job.get("kind"))
        if kind not in SCHEMAS:
            problems.append(f"{kind}: no schema here for this kind")
            continue
        schema = SCHEMAS[kind][0]
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(job), key=lambda e: list(e.path))
        problems += [f"{job['kind']} {'.'.join(map(str, e.path)) or '(top)'}: {schema_message(e)}" for e in errors]
        if errors:
            continue
        for rtype, template in pod_templates(job).items():
            problems += core_problems(template, "V1PodTemplateSpec", f"{rtype}.template")
            problems += pod_problems(rtype, template)
        problems += KIND_CHECKS[job["kind"]](job, made)
    return problems


# --------------------------------------------------------------------------- the real files


def test_the_manifests_are_the_ones_expected():
    names = {str(p.relative_to(EXAMPLES)) for p in MANIFESTS}
    assert {"kubernetes/mpijob.yaml", "kubernetes/pytorchjob.yaml", "doctor/mpijob.yaml"} <= names


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_every_manifest_has_no_problems(path):
    assert manifest_problems(path.read_text()) == []


@pytest.mark.parametrize(
    "path", [EXAMPLES / "kubernetes" / "mpijob.yaml", EXAMPLES / "kubernetes" / "pytorchjob.yaml"], ids=lambda p: p.name
)
def test_the_training_examples_run_a_script_from_the_checkout(path):
    text = path.read_text()
    made, _ = configmaps(text)
    assert made and all(made.values()), "the file says how to make the ConfigMap its pods mount"
    assert any(
        scripts_run(command_of(c))
        for t in pod_templates(yaml.safe_load(text)).values()
        for c in t["spec"]["containers"]
    )


def test_the_docs_point_at_the_manifests():
    for doc in ("docs/kubernetes-slurm.md", "examples/README.md"):
        text = (ROOT / doc).read_text()
        assert "kubernetes/mpijob.yaml" in text and "kubernetes/pytorchjob.yaml" in text, doc
        assert "kubectl create configmap trainbase-examples" in text, doc


# --------------------------------------------------------------------------- planted defects


def planted(name: str, change) -> str:
    text = (EXAMPLES / "kubernetes" / name).read_text()
    if isinstance(change, tuple):  # a text replacement
        old, new = change
        assert old in text, old
        return text.replace(old, new, 1)
    job = yaml.safe_load(text)
    change(job)
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    return header + yaml.safe_dump(job, sort_keys=False)


def worker(job):
    return job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]


def launcher_script(job, old, new):
    cmd = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    assert old in cmd[2], old
    cmd[2] = cmd[2].replace(old, new)


def master(job):
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]


@pytest.mark.parametrize(
    "name, change, reported",
    [
        # core objects, through the client's models
        (
            "mpijob.yaml",
            lambda j: worker(j)["containers"][0]["volumeMounts"][0].update(mountpath="/ex"),
            "Worker.template.spec.containers[0].volumeMounts[0].mountpath: no such field of V1PodTemplateSpec",
        ),
        (
            "mpijob.yaml",
            lambda j: worker(j)["containers"][0].update(volumeMount=worker(j)["containers"][0].pop("volumeMounts")),
            "Worker.template.spec.containers[0].volumeMount[0].name: no such field",
        ),
        (
            "mpijob.yaml",
            lambda j: worker(j)["containers"][0].pop("name"),
            "Worker.template: not a valid V1PodTemplateSpec: Invalid value for `name`, must not be `None`",
        ),
        (
            "pytorchjob.yaml",
            ("--from-file=examples/pytorch_ddp.py", "--from-file=examples/nope.py"),
            "kubectl create configmap trainbase-examples: no such file examples/nope.py",
        ),
        # the Kubeflow resources, through the schema
        (
            "mpijob.yaml",
            lambda j: j["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2),
            "MPIJob spec.mpiReplicaSpecs.Launcher.replicas: 1 was expected",
        ),
        (
            "mpijob.yaml",
            lambda j: j["spec"]["mpiReplicaSpecs"].update(Master=j["spec"]["mpiReplicaSpecs"].pop("Launcher")),
            "MPIJob spec.mpiReplicaSpecs: 'Launcher' is a required property",
        ),
        (
            "mpijob.yaml",
            lambda j: j["spec"]["runPolicy"].update(cleanPodPolicy="OnCompletion"),
            "MPIJob spec.runPolicy.cleanPodPolicy: 'OnCompletion' is not one of",
        ),
        (
            "mpijob.yaml",
            lambda j: j["spec"].update(slotsPerWorkers=j["spec"].pop("slotsPerWorker")),
            "MPIJob spec: Additional properties are not allowed ('slotsPerWorkers' was unexpected)",
        ),
        (
            "pytorchjob.yaml",
            lambda j: master(j)["containers"][0].update(name="trainer"),
            "PyTorchJob spec.pytorchReplicaSpecs.Master.template.spec.containers: no container is named 'pytorch'",
        ),
        (
            "pytorchjob.yaml",
            lambda j: j["spec"]["pytorchReplicaSpecs"].update(Chief=j["spec"]["pytorchReplicaSpecs"].pop("Worker")),
            "PyTorchJob spec.pytorchReplicaSpecs: Additional properties are not allowed ('Chief' was unexpected)",
        ),
        (
            "pytorchjob.yaml",
            lambda j: j["spec"].update(nprocPerNode=8),
            "PyTorchJob spec.nprocPerNode: 8 is not of type 'string'",
        ),
        (
            "pytorchjob.yaml",
            lambda j: j["metadata"].update(name="ddp_torchrun"),
            "PyTorchJob metadata.name: 'ddp_torchrun' does not match",
        ),
        # what makes the job run
        (
            "mpijob.yaml",
            lambda j: worker(j).update(volumes=[v for v in worker(j)["volumes"] if v["name"] != "examples"]),
            "Worker: container 'worker' mounts volume 'examples', which the pod does not have",
        ),
        (
            "mpijob.yaml",
            lambda j: worker(j)["containers"][0].update(
                volumeMounts=[m for m in worker(j)["containers"][0]["volumeMounts"] if m["name"] != "examples"]
            ),
            "Worker: runs /ex/pytorch_ddp.py, which no volume mounts",
        ),
        (
            "mpijob.yaml",
            lambda j: launcher_script(j, "/ex/pytorch_ddp.py", "/ex/train.py"),
            "Worker: /ex/train.py: ConfigMap 'trainbase-examples' as the file's kubectl line makes it has no 'train.py'",
        ),
        (
            "mpijob.yaml",
            lambda j: launcher_script(j, "-np 16", "-np 8"),
            "Launcher: mpirun -np 8, but 2 workers x 8 slots = 16 ranks",
        ),
        (
            "mpijob.yaml",
            lambda j: launcher_script(j, "--map-by ppr:8:node", "--map-by node"),
            "Launcher: ranks must be placed in blocks of 8 a node",
        ),
        (
            "mpijob.yaml",
            lambda j: launcher_script(j, "-x MASTER_ADDR", "-x MASTER_ADDR=ddp-worker-0.ddp-worker"),
            "Launcher: MASTER_ADDR must be the first host of /etc/mpi/hostfile",
        ),
        (
            "mpijob.yaml",
            lambda j: worker(j)["containers"][0]["resources"]["limits"].update({"nvidia.com/gpu": 4}),
            "Worker: 4 GPUs a pod but 8 slots (ranks) a worker",
        ),
        (
            "pytorchjob.yaml",
            lambda j: master(j)["containers"][0].update(command=["python", "/ex/pytorch_ddp.py"]),
            "Master: the command is not torchrun",
        ),
        ("pytorchjob.yaml", lambda j: j["spec"].update(nprocPerNode="4"), "Master: nprocPerNode '4', but 8 GPUs a pod"),
        (
            "pytorchjob.yaml",
            lambda j: master(j)["volumes"][0]["configMap"].update(name="examples"),
            "Master: /ex/pytorch_ddp.py comes from ConfigMap 'examples', which no `kubectl create configmap` line makes",
        ),
    ],
)
def test_a_planted_defect_is_reported(name, change, reported):
    problems = manifest_problems(planted(name, change))
    assert any(p.startswith(reported) for p in problems), problems


def test_the_planted_files_pass_unchanged():
    """The planting itself (YAML round trip, the header kept) changes nothing the checks see."""
    for name in ("mpijob.yaml", "pytorchjob.yaml"):
        assert manifest_problems(planted(name, lambda j: None)) == []


def test_the_client_drops_what_it_does_not_know():
    """Why a dropped key is the unknown-field check: the client's deserializer ignores it."""
    template = {"spec": {"containers": [{"name": "a", "image": "i", "volumeMount": [{"name": "v"}]}]}}
    model = deserialize(copy.deepcopy(template), "V1PodTemplateSpec")
    assert "volumeMount" not in kubernetes.client.ApiClient().sanitize_for_serialization(model)["spec"]["containers"][0]
