"""Where things are: the repository and the files the tests read from it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REPO_CRDS = REPO / "crds"
CHART = REPO / "charts" / "embedjob-operator"
#: the packaged sample of PEP paragraphs (examples/), 989 records
SAMPLE = REPO / "examples" / "pep-sample.jsonl"
#: all PEP paragraphs, next to the repository (../shared/data)
CORPUS = REPO.parent / "shared" / "data" / "pep-paragraphs.jsonl"
