"""Where things are: the repository, the files the tests read from it, and the servers tests/run installs."""

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REPO_CRDS = REPO / "crds"
CHART = REPO / "charts" / "embedjob-operator"
#: the packaged sample of PEP paragraphs (examples/), 989 records
SAMPLE = REPO / "examples" / "pep-sample.jsonl"
#: all 39,545 PEP paragraphs, xz-compressed (read them with support.corpus)
CORPUS = REPO / "data" / "pep-paragraphs.jsonl.xz"


def installed_by_tests_run(variable: str, what: str) -> str:
    """The path tests/run names in `variable` (a test server it installed), else the test fails saying so."""
    import pytest

    path = os.environ.get(variable)
    if not path or not os.path.exists(path):
        pytest.fail(f"these tests need {what}: run them through tests/run, which installs it and sets {variable}")
    return path
