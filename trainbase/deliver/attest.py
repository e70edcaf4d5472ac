"""Signed SBOM and provenance attached to every pushed digest, and their verification.

- ``build.py --matrix --push --registry R --sign-key KEY``: after each push (and for a tag that
  was already there but lacks them), the cell's SBOM and SLSA provenance are signed with KEY
  and attached to the pushed digest as OCI referrers (deliver/referrers.py); a multi-arch
  index gets them per platform manifest, which is what a pull on each architecture resolves
  to. Promotion retags by digest within the repository, so `latest` carries them too; images
  staged per platform keep theirs when `--merge-platforms` copies them into the index.
- ``build.py --verify-attestations [REF] --public-key KEY``: REF (``HOST/REPO:TAG`` or
  ``@sha256:...``), or every selected cell's published tag in ``--registry``: both predicates
  must be attached, signed by KEY and about exactly that digest; exit 1 otherwise, naming
  what is missing or which check failed. Nothing is pulled: only manifests and the small
  attestation blobs are read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from trainbase_common import safe_io, states

from ..define.matrix import Cell, Matrix
from ..errors import TrainbaseError
from ..supply import attestation as att
from . import referrers, registry

if TYPE_CHECKING:
    from securesystemslib.signer import Key

    from .publish import Publishable


def _subjects(client: referrers.Client, repo: str, ref: str, platform: str = "") -> list[referrers.Descriptor]:
    """The descriptors a pull of REPO:REF resolves to: the PLATFORM manifest of an index (every
    platform's when PLATFORM is empty), else the manifest itself."""
    d = client.descriptor(repo, ref)
    if d.media_type not in (referrers.OCI_INDEX, referrers.DOCKER_LIST):
        return [d]
    index = json.loads((client.manifest(repo, d.digest) or (b"{}", ""))[0])
    found = [
        referrers.Descriptor(m["mediaType"], m["digest"], int(m["size"]))
        for m in index.get("manifests", [])
        if not platform
        or f"{(m.get('platform') or {}).get('os')}/{(m.get('platform') or {}).get('architecture')}" == platform
    ]
    if not found:
        raise TrainbaseError(f"{client.host}/{repo}:{ref} has no {platform or 'platform'} manifest")
    return found


class Attester:
    """Attaches the signed statements of pushed cells (publish.py calls ``attach``)."""

    def __init__(self, registry_arg: str, supply_dir: Path, key_path: Path, out: TextIO):
        self.host, _ = registry.split_registry(registry_arg)
        self.supply_dir, self.out = supply_dir, out
        try:
            self.signer = att.load_signer(key_path)
        except att.AttestationError as e:
            raise TrainbaseError(str(e)) from None
        self.client: referrers.Client | None = None

    def attach(self, j: Publishable, repo: str, ref: str) -> None:
        from trainbase_common import engine

        docs = self.supply_dir / j.name / j.tag
        if not (docs / "sbom.cdx.json").is_file() or not (docs / "inputs.lock.json").is_file():
            raise TrainbaseError(
                f"{j.name}: cannot attest {repo}:{ref}: no SBOM and input lock under {docs} "
                "(the supply-chain step writes them; do not build with --no-supply)"
            )
        self.client = self.client or referrers.Client(self.host)
        subject = _subjects(self.client, repo, ref, j.platform)[0]
        keyid = self.signer.public_key.keyid
        have = {
            dict(d.annotations).get(att.PREDICATE_ANNOTATION)
            for d in self.client.referrers(repo, subject.digest, att.DSSE_MEDIA_TYPE)
            if dict(d.annotations).get(att.KEYID_ANNOTATION) == keyid
        }
        info = engine.inspect_image(j.image)
        labels = dict(info.labels) if info is not None else {}
        lock = safe_io.load_json_object(docs / "inputs.lock.json")
        predicates = {
            att.SBOM: json.loads((docs / "sbom.cdx.json").read_text()),
            att.PROVENANCE: att.provenance(j.name, j.platform, lock, labels),
        }
        for ptype, predicate in predicates.items():
            if ptype in have:
                self.out.write(
                    f"attest: {j.name}: {ptype} already attached to {subject.digest[:19]} (key {keyid[:12]})\n"
                )
                continue
            envelope = att.sign(att.statement(f"{self.host}/{repo}", subject.digest, ptype, predicate), self.signer)
            d = self.client.attach(
                repo,
                subject,
                att.DSSE_MEDIA_TYPE,
                envelope,
                att.DSSE_MEDIA_TYPE,
                {att.PREDICATE_ANNOTATION: ptype, att.KEYID_ANNOTATION: keyid},
            )
            self.out.write(
                f"attest: {j.name}: {ptype} signed (key {keyid[:12]}) and attached to "
                f"{self.host}/{repo}@{subject.digest} as {d.digest[:19]}\n"
            )


def verify_ref(client: referrers.Client, repo: str, ref: str, platform: str, key: Key, out: TextIO) -> bool:
    """Whether REPO:REF (its PLATFORM manifest; of an index, every platform's when PLATFORM is
    empty) has both predicates signed by KEY; each finding printed."""
    # every subject verified and printed (a list, not all()'s generator: no early stop)
    return all([_verify_subject(client, repo, s, key, out) for s in _subjects(client, repo, ref, platform)])  # noqa: C419


def _verify_subject(client: referrers.Client, repo: str, subject: referrers.Descriptor, key: Key, out: TextIO) -> bool:
    found = client.referrers(repo, subject.digest)
    where = f"{client.host}/{repo}@{subject.digest}"
    ok = True
    for ptype in att.PREDICATES:
        errors = []
        for d in found:
            ann = dict(d.annotations)
            if d.artifact_type != att.DSSE_MEDIA_TYPE or ann.get(att.PREDICATE_ANNOTATION) != ptype:
                continue
            data, _ = client.manifest(repo, d.digest) or (b"{}", "")
            layers = json.loads(data).get("layers") or [{}]
            try:
                att.verify(client.blob(repo, layers[0]["digest"]), key, subject.digest, ptype)
            except (att.AttestationError, KeyError) as e:
                errors.append(f"{d.digest[:19]}: {e}")
                continue
            out.write(f"verify: {where}: {ptype}: signed by {key.keyid[:12]}, subject matches ({d.digest[:19]})\n")
            break
        else:
            ok = False
            why = "; ".join(errors) if errors else "nothing attached"
            out.write(f"verify: {where}: {ptype}: NOT verified ({why})\n")
    keyless = [d for d in found if "sigstore.bundle" in d.artifact_type]
    if keyless:
        out.write(
            f"verify: {where}: {len(keyless)} keyless Sigstore bundle(s) attached too: verify those with "
            "`gh attestation verify` or `cosign verify-attestation` (docs/supply-chain.md)\n"
        )
    return ok


def verify_command(
    m: Matrix,
    root: Path,
    selected: list[Cell],
    ref: str,
    registry_arg: str | None,
    key_path: str | None,
    out: TextIO = sys.stdout,
) -> int:
    from ..render import recipes as rendermod
    from .platforms import publishable

    if not key_path:
        raise TrainbaseError("--verify-attestations needs --public-key PEM (the key the images were signed with)")
    try:
        key = att.load_public_key(Path(key_path))
    except att.AttestationError as e:
        raise TrainbaseError(str(e)) from None
    targets: list[tuple[str, str, str, str]] = []  # host, repo, ref, platform
    never: list[str] = []  # selected repositories nothing of which is built
    if ref:
        host, _, rest = ref.partition("/")
        repo, sep, digest = rest.partition("@")
        if not sep:
            repo, _, digest = rest.rpartition(":")
        if not repo or not digest:
            raise TrainbaseError(f"--verify-attestations {ref!r}: expected HOST/REPO:TAG or HOST/REPO@sha256:...")
        targets.append((host, repo, digest, ""))
    else:
        if not registry_arg:
            raise TrainbaseError("--verify-attestations without a reference needs --registry HOST[:PORT]/NAMESPACE")
        host, ns = registry.split_registry(registry_arg)
        rendered = rendermod.render_all(m, selected, root=root)
        # each published platform under its repository's release tag; a refused platform is in no index
        for repo, release in sorted(publishable(m, rendered, selected).items()):
            if release.left_out:
                out.write(f"verify: {repo}: never published, not verified: {release.why_not()}\n")
            if not release.tag:
                never.append(repo)
            targets += [(host, f"{ns}/{repo}", release.tag or "", c.platform) for c in release.cells]
    clients: dict[str, referrers.Client] = {}
    bad = 0
    for host, repo, r, platform in targets:
        client = clients.setdefault(host, referrers.Client(host))
        bad += not verify_ref(client, repo, r, platform, key, out)
    out.write(f"verify: {len(targets) - bad} of {len(targets)} image(s) verified\n")
    if never:
        out.write(f"verify: nothing of {', '.join(never)} can be published: nothing to verify there\n")
    return 1 if bad or never else 0


SIGSTORE_PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"  # what actions/attest and cosign write


def sbom_of(client: referrers.Client, repo: str, ref: str, platform: str) -> dict[str, Any] | None:
    """The CycloneDX SBOM attached to what REPO:REF resolves to on PLATFORM: the predicate of a
    key-signed DSSE envelope or of a keyless Sigstore bundle's envelope. Read, not verified:
    the security check only decides whether to rebuild (verification: verify_ref, or gh/cosign)."""
    import base64

    subject = _subjects(client, repo, ref, platform)[0]
    for d in client.referrers(repo, subject.digest):
        ann = dict(d.annotations)
        if att.SBOM not in (ann.get(att.PREDICATE_ANNOTATION), ann.get(SIGSTORE_PREDICATE_ANNOTATION)):
            continue
        data, _ = client.manifest(repo, d.digest) or (b"{}", "")
        layers = json.loads(data).get("layers") or []
        if not layers:
            continue
        doc = json.loads(client.blob(repo, layers[0]["digest"]))
        envelope = doc.get("dsseEnvelope", doc)  # a Sigstore bundle holds the envelope
        stmt = json.loads(base64.b64decode(envelope["payload"]))
        if stmt.get("predicateType") == att.SBOM:
            predicate: dict[str, Any] = stmt["predicate"]
            return predicate
    return None


def fetch_sboms(
    m: Matrix,
    root: Path,
    selected: list[Cell],
    registry_arg: str,
    out_dir: Path,
    out: TextIO = sys.stdout,
    missing: list[str] | None = None,
) -> list[Path]:
    """The SBOM of what each selected repository's ``latest`` is now (what users pull), one
    file per cell under OUT_DIR; a published cell without one is named (it cannot be checked):
    an error, or -- with ``missing`` -- appended there and passed over, so that one unattested
    image (promoted before promotion required attestations) does not stop every other row's
    security check."""
    from ..render import recipes as rendermod
    from .platforms import publishable
    from .publish import ALIAS

    host, ns = registry.split_registry(registry_arg)
    client = referrers.Client(host)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    # a refused platform was never built: latest holds no image of it, so no SBOM to read for it
    built = {
        c.name for r in publishable(m, rendermod.render_all(m, selected, root=root), selected).values() for c in r.cells
    }
    for c in selected:
        if c.name not in built:
            out.write(f"sbom: {c.name}: never built (refused), so not published\n")
            continue
        repo = f"{ns}/{c.image or c.name}"
        if client.manifest(repo, ALIAS) is None:
            out.write(f"sbom: {c.name}: {repo}:{ALIAS} not published\n")
            continue
        sbom = sbom_of(client, repo, ALIAS, c.platform)
        if sbom is None:
            why = f"{host}/{repo}:{ALIAS} ({c.platform}) has no SBOM attached: it cannot be checked"
            if missing is None:
                raise TrainbaseError(why)
            out.write(f"sbom: {c.name}: {why} (the next build attests it: ci_matrix plans it)\n")
            missing.append(f"{c.name}: {why}")
            continue
        p = out_dir / f"{c.name}.cdx.json"
        p.write_text(json.dumps(sbom))
        paths.append(p)
    return paths


# what actions/attest (keyless, push-to-registry) attaches to a digest: a Sigstore bundle per
# predicate, as an OCI referrer naming its predicate type (SIGSTORE_PREDICATE_ANNOTATION)
KEYLESS_BUNDLE = "application/vnd.dev.sigstore.bundle.v0.3+json"


def keyless_attested(client: referrers.Client, repo: str, digest: str) -> bool:
    """Whether DIGEST already carries both keyless attestations (SBOM and provenance)."""
    have = {
        dict(d.annotations).get(SIGSTORE_PREDICATE_ANNOTATION) for d in client.referrers(repo, digest, KEYLESS_BUNDLE)
    }
    return set(att.PREDICATES) <= have


def _statement_subjects(client: referrers.Client, repo: str, d: referrers.Descriptor) -> tuple[str, set[str]]:
    """(predicate type, subject digests) of the in-toto statement a keyless bundle carries."""
    import base64

    data, _ = client.manifest(repo, d.digest) or (b"{}", "")
    layers = json.loads(data).get("layers") or [{}]
    doc = json.loads(client.blob(repo, layers[0]["digest"]))
    stmt = json.loads(base64.b64decode((doc.get("dsseEnvelope") or doc)["payload"]))
    return str(stmt.get("predicateType", "")), {
        f"sha256:{x.get('digest', {}).get('sha256', '')}" for x in stmt.get("subject") or []
    }


SIGNER_WORKFLOW = ".github/workflows/build-cells.yml"  # the reusable workflow that signs (keyless)


def gh_verify(ref: str, predicate: str, github_repo: str, run: Callable[..., Any] | None = None) -> str:
    """Why `gh attestation verify` does not accept REF's (HOST/REPO@DIGEST) keyless PREDICATE
    bundle as signed by GITHUB_REPO's build-cells.yml ('' when it does): the Sigstore
    certificate chain, the signer workflow's identity and the subject digest, read from the
    registry's referrers (``--bundle-from-oci``; the registry login `docker login` stored)."""
    import subprocess

    cmd = [
        "gh",
        "attestation",
        "verify",
        f"oci://{ref}",
        "--bundle-from-oci",
        "--repo",
        github_repo,
        "--signer-workflow",
        f"{github_repo}/{SIGNER_WORKFLOW}",
        "--predicate-type",
        predicate,
    ]
    try:
        p = (run or subprocess.run)(cmd, capture_output=True, text=True, timeout=300, check=False)
    except FileNotFoundError:
        return "gh (the GitHub CLI) is not installed: the keyless signatures cannot be verified"
    if p.returncode == 0:
        return ""
    said = ((p.stderr or p.stdout) or "").strip().splitlines()
    return f"gh attestation verify refused it ({said[-1][:300] if said else f'exit {p.returncode}'})"


def attestation_problems(
    client: referrers.Client,
    repo: str,
    digest: str,
    key: Key | None = None,
    github_repo: str = "",
    run: Callable[..., Any] | None = None,
) -> list[str]:
    """What keeps REPO@DIGEST from being attested (empty: attested): on the manifest, or on
    EVERY platform manifest of an index (what a pull on each architecture resolves to), both
    predicates -- signed by KEY and verified (verify_ref); without a key, CI's keyless Sigstore
    bundles, each a statement about exactly that digest, and -- with GITHUB_REPO (CI's promote
    job) -- each signed by that repository's build-cells.yml (gh_verify)."""
    import io

    problems = []
    for subject in _subjects(client, repo, digest):
        if key is not None:
            log = io.StringIO()
            if not _verify_subject(client, repo, subject, key, log):
                where = f"{client.host}/{repo}@{subject.digest}: "
                problems += [
                    f"{subject.digest[:19]}: {line.split(where, 1)[-1]}"
                    for line in log.getvalue().splitlines()
                    if "NOT verified" in line
                ]
            continue
        have = set()
        for d in client.referrers(repo, subject.digest, KEYLESS_BUNDLE):
            try:
                ptype, about = _statement_subjects(client, repo, d)
            except (ValueError, KeyError, TypeError) as e:
                problems.append(f"{subject.digest[:19]}: bundle {d.digest[:19]} unreadable ({e})")
                continue
            if subject.digest in about:
                have.add(ptype)
        problems += [f"{subject.digest[:19]}: {p}: nothing attached" for p in att.PREDICATES if p not in have]
        for p in (p for p in att.PREDICATES if p in have and github_repo):
            why = gh_verify(f"{client.host}/{repo}@{subject.digest}", p, github_repo, run)
            if why:
                problems.append(f"{subject.digest[:19]}: {p}: {why}")
    return problems


def unattested(client: referrers.Client, repo: str, digest: str) -> list[str]:
    """The manifests of REPO@DIGEST (every platform's, of an index) that lack a predicate --
    key-signed or keyless, by the annotation each carries -- as ``sha256:...: PREDICATE``: what
    the CI plan re-attests (ci_matrix.with_registry_state). Presence only, for planning; what
    promotion requires is verified (attestation_problems)."""
    lacking = []
    for subject in _subjects(client, repo, digest):
        have = set()
        for d in client.referrers(repo, subject.digest):
            ann = dict(d.annotations)
            have |= {ann.get(att.PREDICATE_ANNOTATION), ann.get(SIGSTORE_PREDICATE_ANNOTATION)}
        lacking += [f"{subject.digest[:19]}: {p}" for p in att.PREDICATES if p not in have]
    return lacking


def attestation_check(public_key: str | None, github_repo: str = "") -> Callable[[str], list[str]]:
    """promote.py's ``attested``: HOST/REPO@DIGEST -> attestation_problems, one client per host."""
    key = None
    if public_key:
        try:
            key = att.load_public_key(Path(public_key))
        except att.AttestationError as e:
            raise TrainbaseError(str(e)) from None
    clients: dict[str, referrers.Client] = {}

    def problems(ref: str) -> list[str]:
        host, _, rest = ref.partition("/")
        repo, _, digest = rest.partition("@")
        client = clients.setdefault(host, referrers.Client(host))
        return attestation_problems(client, repo, digest, key, github_repo)

    return problems


def github_subject(
    report_path: Path, supply_dir: Path, out_dir: Path, client_for: Callable[[str], referrers.Client] = referrers.Client
) -> dict[str, str]:
    """For CI's keyless signing (actions/attest, build-cells.yml): the digests of the one cell of
    a publish report that still need their attestations -- what it pushed, and what it found
    already published without them (a run whose attestation step failed after the push: its
    re-run finds the tag present) -- the immutable tag's digest and its zstd twin's, with the
    subject's name and the two predicate files (the provenance written to OUT_DIR). An empty
    digest output: that one is attested already. {} when the cell published nothing."""
    from trainbase_common import engine

    from .publish import ZSTD

    cells = states.build_report(report_path)["cells"]
    mine = [c for c in cells if c.get("repo_digest") and (c.get("pushed") or c.get("already_published"))]
    if len(mine) > 1:
        raise TrainbaseError(f"{report_path}: {len(mine)} cells published; the CI job attests one (select name=CELL)")
    if not mine:
        return {}
    c = mine[0]
    pushed, present = c.get("pushed") or [], c.get("already_published") or []
    tags = [r for r in pushed + present if not r.endswith(ZSTD)]
    twins = [r for r in pushed + present if r.endswith(ZSTD)]
    if not tags:
        raise TrainbaseError(f"{report_path}: {c['name']} published no immutable tag, only {twins}")
    name = tags[0].rsplit(":", 1)[0]
    host, repo = name.split("/", 1)
    client: referrers.Client | None = None

    def needs(ref: str, digest: str) -> str:
        nonlocal client
        if ref in pushed:
            return digest
        client = client or client_for(host)
        return "" if keyless_attested(client, repo, digest) else digest

    subject = needs(tags[0], c["repo_digest"])
    twin = ""
    if twins:
        client = client or client_for(host)
        twin = needs(twins[0], client.descriptor(repo, twins[0].rsplit(":", 1)[1]).digest)
    if not subject and not twin:
        return {}
    docs = supply_dir / c["name"] / c["tag"]
    lock = safe_io.load_json_object(docs / "inputs.lock.json")
    info = engine.inspect_image(c["image"])
    predicate = att.provenance(c["name"], c["platform"], lock, dict(info.labels) if info else {})
    out_dir.mkdir(parents=True, exist_ok=True)
    safe_io.atomic_write(out_dir / "provenance.slsa.json", json.dumps(predicate, indent=2) + "\n")
    return {
        "subject-name": name,
        "subject-digest": subject,
        "twin-digest": twin,
        "sbom": str(docs / "sbom.cdx.json"),
        "provenance": str(out_dir / "provenance.slsa.json"),
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m trainbase.deliver.attest REPORT [--supply-dir D] [--out D]`: KEY=VALUE lines
    for $GITHUB_OUTPUT (github_subject)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m trainbase.deliver.attest")
    p.add_argument("report", type=Path)
    p.add_argument("--supply-dir", type=Path, default=Path("reports/supply"))
    p.add_argument("--out", type=Path, default=Path("reports/attest"))
    a = p.parse_args(argv)
    try:
        for k, v in github_subject(a.report, a.supply_dir, a.out).items():
            print(f"{k}={v}")
    except safe_io.InputError as e:  # a report or lock another run wrote that cannot be read
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (TrainbaseError, OSError, KeyError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
