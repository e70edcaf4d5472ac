"""Static checks whose unit entries drove only the function their verdict comes from
(transport_settings.defects, linkage.unexplained_gaps), now run as they are on a fake image:
its `docker inspect` ENV, what `env -0` and a login shell print, the settings files the check
cats, and probes/unresolved_libs.py's JSON. The broken variants fabric-off-baked-in and
ucx-perftest-missing-lib show the same on a real rebuild."""

from types import SimpleNamespace

import pytest

from trainbase_conformance.checks import test_ib, test_integrity

PATH = "PATH=/opt/trainbase/venv/bin:/opt/openmpi/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageTarget:
    """An image: its ENV (docker inspect), the environment a shell and a login shell see, the
    settings files found, and the JSON the probe prints."""

    def __init__(self, env=(PATH,), files="", login_adds=(), probe=None):
        self.inspect = {"Config": {"Env": list(env)}}
        self.env, self.files, self.login_adds, self.probe = list(env), files, list(login_adds), probe
        self.python = "/opt/trainbase/venv/bin/python"

    def sh(self, cmd, timeout=None):
        out = "\0".join(self.env) + "\0" if cmd == "env -0" else self.files
        return SimpleNamespace(rc=0, stdout=out, stderr="")

    def login(self, cmd, timeout=None):
        return SimpleNamespace(rc=0, stdout="\0".join(self.env + self.login_adds) + "\0", stderr="")

    def json_probe(self, cmd, timeout=None):
        return self.probe


@pytest.mark.parametrize(
    "img, why",
    [
        (ImageTarget(env=(PATH, "NCCL_IB_DISABLE=1")), r"NCCL_IB_DISABLE=1 \(image ENV\)"),
        (ImageTarget(files="\n==> /etc/nccl.conf\nNCCL_IB_DISABLE=1\n"), r"NCCL_IB_DISABLE=1 \(/etc/nccl\.conf\)"),
        (ImageTarget(login_adds=("UCX_TLS=tcp,self",)), r"UCX_TLS=tcp,self \(login shell \(/etc/profile\.d\)\)"),
    ],
)
def test_a_baked_setting_that_takes_the_fabric_away_fails_the_check(img, why):
    test_ib.test_no_baked_setting_switches_the_fabric_off(ImageTarget())
    with pytest.raises(AssertionError, match=r"settings baked into the image that take the fabric away:\n\s*" + why):
        test_ib.test_no_baked_setting_switches_the_fabric_off(img)


def scan(unresolved, scanned=1834):
    return {"scanned": scanned, "unresolved": unresolved, "shipped": {}}


@pytest.mark.parametrize(
    "probe, why",
    [
        (
            scan({"/usr/bin/ucx_perftest": ["libgomp.so.1"]}),
            r"1 of 1834 programs/libraries link a library that is not in the image:\n\s*/usr/bin/ucx_perftest: libgomp\.so\.1",
        ),
        (scan({}, scanned=3), r"the scan found only 3 ELF files under /opt /usr/local"),
    ],
)
def test_a_program_that_links_a_missing_library_fails_the_check(probe, why):
    test_integrity.test_every_program_and_library_resolves_its_libraries(ImageTarget(probe=scan({})))
    with pytest.raises(AssertionError, match=why):
        test_integrity.test_every_program_and_library_resolves_its_libraries(ImageTarget(probe=probe))
