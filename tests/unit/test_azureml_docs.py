"""docs/azureml.md, checked with the real Azure ML SDK v2 (`azure-ai-ml`, requirements-dev.txt):
every job YAML loads with `azure.ai.ml.load_job` (schema, distribution and `code:` path
validated as `az ml job create` would), every Python snippet runs and builds its jobs, and the
jobs follow the launch rules the page states. Nothing is submitted: MLClient is a recorder."""

import re
from types import SimpleNamespace

import pytest

from .conftest import ROOT

DOC = ROOT / "docs" / "azureml.md"
aml = pytest.importorskip("azure.ai.ml", reason="azure-ai-ml is not installed: `pip install -r requirements-dev.txt`")
from azure.ai.ml.entities import Command, Job  # noqa: E402  (after the importorskip)

# the SDK's own schemas still use marshmallow's `context`: not this repository's to fix
pytestmark = pytest.mark.filterwarnings("ignore:The `context` parameter is deprecated")


def snippets(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", DOC.read_text(), re.S | re.M)


class Recorder:
    """Stands in for MLClient: create_or_update records what would have been submitted."""

    def __init__(self):
        self.sent = []
        record = SimpleNamespace(create_or_update=lambda obj, **kw: self.sent.append(obj) or obj)
        self.jobs, self.environments = record, record


@pytest.fixture
def client(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(aml.MLClient, "from_config", classmethod(lambda cls, *a, **kw: rec))
    return rec


def load_yaml(text, tmp_path):
    """A job YAML as `az ml job create -f` reads it: relative `code:` resolved next to the file."""
    if m := re.search(r"^code:\s*(\S+)", text, re.M):
        (tmp_path / m.group(1)).mkdir(parents=True, exist_ok=True)
    path = tmp_path / "job.yml"
    path.write_text(text)
    return aml.load_job(path)


def run_python(upto: int, client, tmp_path, monkeypatch) -> dict:
    """The page's Python snippets 0..upto in order, in one namespace, as a reader pastes them."""
    monkeypatch.chdir(tmp_path)
    ns = {"__name__": "azureml_doc"}
    for code in snippets("python")[: upto + 1]:
        exec(compile(code, str(DOC), "exec"), ns)  # noqa: S102 -- the documentation's own snippets are what is tested
    return ns


def jobs_of(ns: dict, client) -> list:
    built = [v for v in ns.values() if isinstance(v, (Command, Job))]
    seen = {id(j) for j in built}  # by identity: the SDK's __eq__ finds different jobs equal
    return built + [j for j in client.sent if isinstance(j, (Command, Job)) and id(j) not in seen]


@pytest.mark.parametrize("i", range(len(snippets("yaml"))))
def test_every_job_yaml_loads_with_the_sdk(i, tmp_path):
    job = load_yaml(snippets("yaml")[i], tmp_path)
    assert job.distribution is not None and job.command


@pytest.mark.parametrize("i", range(len(snippets("python"))))
def test_every_python_snippet_runs_with_the_sdk(i, client, tmp_path, monkeypatch):
    run_python(i, client, tmp_path, monkeypatch)


def all_jobs(client, tmp_path, monkeypatch) -> dict[str, list]:
    ns = run_python(len(snippets("python")) - 1, client, tmp_path, monkeypatch)
    yamls = []
    for i, text in enumerate(snippets("yaml")):
        (tmp_path / f"y{i}").mkdir()
        yamls.append(load_yaml(text, tmp_path / f"y{i}"))
    return {"yaml": yamls, "python": jobs_of(ns, client)}


def test_every_mode_is_shown_in_yaml_and_python(client, tmp_path, monkeypatch):
    for form, jobs in all_jobs(client, tmp_path, monkeypatch).items():
        shown = {(j.distribution.type, getattr(j.distribution, "process_count_per_instance", None) == 1) for j in jobs}
        # mpi, pytorch per process, pytorch per node (one process a node + torchrun), tensorflow
        assert {("mpi", False), ("pytorch", False), ("pytorch", True)} <= shown, (form, shown)
        assert "tensorflow" in {t for t, _ in shown}, (form, shown)


def test_jobs_follow_the_launch_rules(client, tmp_path, monkeypatch):
    for form, jobs in all_jobs(client, tmp_path, monkeypatch).items():
        for j in jobs:
            d, cmd = j.distribution, j.command
            per_instance = getattr(d, "process_count_per_instance", None)
            where = f"{form} job {cmd!r} ({d.type}, process_count_per_instance={per_instance})"
            # Azure ML starts process_count_per_instance processes itself: torchrun under more
            # than one would start N x N; torchrun belongs to the per-node mode only
            if re.search(r"\btorchrun\b|torch\.distributed\.(run|launch)", cmd):
                assert d.type == "pytorch" and per_instance == 1, where
            # under mpi nothing sets RANK/MASTER_ADDR: the PyTorch examples need the contract
            if d.type == "mpi" and re.search(r"pytorch_ddp|lightning|deepspeed", cmd):
                assert "tb-launch" in cmd, where
            if d.type == "tensorflow":
                assert "--tf" not in cmd or "tb-launch" in cmd, where
            assert j.resources.instance_count == 2, where


def test_the_v1_to_v2_table_is_kept():
    text = DOC.read_text()
    assert "| SDK v1 (`azureml-core`) | SDK v2 (`azure-ai-ml`) |" in text
    for v1 in ("MpiConfiguration(", "PyTorchConfiguration(", "TensorflowConfiguration(", "ScriptRunConfig("):
        assert v1 in text, v1


def deepspeed_by_branch() -> list[tuple[int, str, str]]:
    """(branch, image, how) of azureml.md's table after its marker."""
    text = DOC.read_text().split("<!-- azureml deepspeed by branch -->", 1)[1]
    return [
        (int(m.group(1)), m.group(2), m.group(3))
        for m in re.finditer(r"^\| R(\d{3}) \| `([^`]+)` \| ([^|]+) \|", text.split("\n\n", 1)[0], re.M)
    ]


def test_the_deepspeed_image_of_each_driver_branch_starts_on_it_and_exists():
    """Every driver branch an ND H100 v5 runs (R535 to R595) has a row; each row's image is a
    DeepSpeed cell of the matrix whose evaluated driver promise (its CUDA natively, or its
    nvidia/cuda base's forward-compatibility branches on a data-center GPU) admits the branch,
    the way the row says; and the page's DeepSpeed job spec names one of them."""
    import json

    from trainbase.define import base_lock
    from trainbase.define.matrix import load
    from trainbase.render import catalogue

    locks = base_lock.load(ROOT)

    m = load(ROOT / "matrix.yaml")
    rows = deepspeed_by_branch()
    assert [b for b, _, _ in rows] == [535, 550, 570, 575, 580, 590, 595]
    for branch, image, how in rows:
        cell = m.cell(image)
        assert cell is not None and not cell.excluded and cell.framework == "deepspeed", image
        p = catalogue.promise_of(json.loads((ROOT / "images" / image / "manifest.json").read_text()), locks)
        native = int(p.native.split(".")[0]) if p.native else 10**6
        if how.startswith("natively"):
            assert branch >= native, (branch, image, p.text())
        else:
            assert how.startswith("forward compatibility") and branch in p.forward_compat and branch < native, (
                branch,
                image,
                p.text(),
            )
    job = next(y for y in snippets("yaml") if "deepspeed_init.py" in y)
    assert any(f"/{image}:" in job for _, image, _ in rows), job
