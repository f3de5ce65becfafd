"""Where things are: the repository and the files the tests read from it."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REPO_CRDS = REPO / "crds"
CHART = REPO / "charts" / "embedjob-operator"
#: the packaged sample of PEP paragraphs (examples/), 989 records
SAMPLE = REPO / "examples" / "pep-sample.jsonl"
#: all 39,545 PEP paragraphs, xz-compressed (read them with support.corpus)
CORPUS = REPO / "data" / "pep-paragraphs.jsonl.xz"
