"""`kubectl explain` of the EmbeddingJob CRD on the real API server: the object, spec, status and every
field below them have a description (none `<empty>`), as the API server publishes it (OpenAPI v3)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from support.crd_schema import STANDARD_FIELDS, fields, root_schema
from support.polling import wait_until

pytestmark = pytest.mark.k8s


@pytest.fixture(scope="module")
def published(kube):
    """The API server publishes a CRD's OpenAPI schema (what `kubectl explain` reads) a little after it is
    Established."""
    wait_until("the EmbeddingJob schema published", lambda: kube.kubectl(
        "explain", "embeddingjobs", check=False).returncode == 0, timeout=60)
    return kube


def explain(kube, path: str, *flags: str) -> str:
    return kube.kubectl("explain", path, *flags).stdout


def description_of(output: str) -> str:
    """The DESCRIPTION section of `kubectl explain` (up to FIELDS or the end), on one line."""
    match = re.search(r"^DESCRIPTION:\n(.*?)(?=^FIELDS:|\Z)", output, re.S | re.M)
    assert match, output
    return " ".join(match.group(1).split())


@pytest.mark.parametrize("path", ["ej", "ej.spec", "ej.status", "ej.status.conditions", "ej.status.progress",
                                  "ej.status.rayJobName", *(f"ej.{name}" for name in STANDARD_FIELDS)])
def test_the_paths_a_newcomer_explains_first_are_described(published, path):
    output = explain(published, path)
    assert "<empty>" not in output, output
    assert len(description_of(output)) > 20, output


def test_every_field_is_described_as_the_model_says(published):
    expected = dict(fields(root_schema()))
    recursive = explain(published, "embeddingjobs", "--recursive")
    for path in list(expected)[1:]:  # the API server publishes every field of the generated schema
        assert re.search(rf"^\s*{re.escape(path.rsplit('.', 1)[-1])}\s", recursive, re.M), path
    with ThreadPoolExecutor(4) as pool:
        outputs = dict(zip(expected, pool.map(lambda path: explain(published, path), expected)))
    empty = [path for path, output in outputs.items() if "<empty>" in output]
    assert not empty, empty
    for path, output in outputs.items():
        words = " ".join(expected[path]["description"].split()[:6])
        assert description_of(output).startswith(words), (path, output)
