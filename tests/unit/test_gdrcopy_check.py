"""trainbase_conformance/checks/test_gdrcopy.py against fake images: the check fails for each
thing it is there to catch (no library, another release, a label that names another), naming it."""

from __future__ import annotations

import json

import pytest

from trainbase_conformance.checks import test_gdrcopy as check


class Image:
    """A target whose libversions.py probe answers ``probe`` for gdrcopy and whose manifest
    declares GDRCopy 2.6."""

    def __init__(self, probe: dict, label: str | None = "2.6", foreign: bool = False):
        self.python, self.foreign, self.probe = "/opt/trainbase/venv/bin/python", foreign, probe
        self.components = {"gdrcopy": {"version": "2.6"}}
        self.labels = {check.LABEL: label} if label else {}
        self.asked: list[str] = []

    def require(self, key: str) -> None:
        assert key == "gdrcopy"

    def json_probe(self, cmd: str, timeout: int = 120) -> dict:
        self.asked.append(cmd)
        return {"gdrcopy": json.loads(json.dumps(self.probe))}


LOADED = {"version": "2.6", "path": "/opt/gdrcopy/lib/libgdrapi.so.2.6"}


def test_the_declared_release_loaded_by_its_soname_passes():
    image = Image(LOADED)
    check.test_libgdrapi_loads_and_is_the_declared_release(image)
    assert image.asked and image.asked[0].endswith("libversions.py gdrcopy=libgdrapi.so.2")


def test_a_library_that_does_not_load_fails_with_the_linkers_words():
    image = Image(
        {
            "soname": "libgdrapi.so.2",
            "error": "libgdrapi.so.2: cannot open shared object file: No such file or directory",
        }
    )
    with pytest.raises(AssertionError, match=r"libgdrapi\.so\.2 does not load: libgdrapi\.so\.2: cannot open shared"):
        check.test_libgdrapi_loads_and_is_the_declared_release(image)


def test_another_release_than_the_manifest_says_fails_naming_the_file():
    image = Image({"version": "2.5", "path": "/usr/lib/x86_64-linux-gnu/libgdrapi.so.2.5"})
    with pytest.raises(
        AssertionError,
        match=r"the manifest says GDRCopy 2\.6, the loaded /usr/lib/x86_64-linux-gnu/libgdrapi\.so\.2\.5 is 2\.5",
    ):
        check.test_libgdrapi_loads_and_is_the_declared_release(image)


def test_a_label_that_names_another_release_fails_and_a_foreign_image_has_none_to_check():
    with pytest.raises(AssertionError, match=r"io\.trainbase\.gdrcopy is 2\.5, the loaded /opt/gdrcopy/lib/libgdrapi"):
        check.test_libgdrapi_loads_and_is_the_declared_release(Image(LOADED, label="2.5"))
    with pytest.raises(AssertionError, match=r"io\.trainbase\.gdrcopy is None"):
        check.test_libgdrapi_loads_and_is_the_declared_release(Image(LOADED, label=None))
    check.test_libgdrapi_loads_and_is_the_declared_release(Image(LOADED, label=None, foreign=True))


def test_the_soname_follows_the_api_major_version():
    assert check.soname("2.6") == "libgdrapi.so.2" and check.soname("3.0") == "libgdrapi.so.3"
