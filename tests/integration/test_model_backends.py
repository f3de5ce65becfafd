"""Model backends and precisions with the real packaged model: vectors close to float32 torch, and
jobs whose vectors are recorded under a revision that names backend and precision."""

import json
import sys

import numpy as np
import onnx
import pytest
import yaml

from embedjob.api import parse_spec
from embedjob_worker.encode.actors import EmbeddingWorker
from embedjob_worker.encode.exported import export_model, read_export
from embedjob_worker.encode.model import load_model, resolve_model
from embedjob_worker.encode.onnx_export import down_projections
from support.cli import EMBEDJOB, manifest, run, run_on_ray
from support.corpus import corpus_lines
from support.driver_jobs import write_input
from support.job_models import TORCH_MODEL
from support.manifests import merged
from support.sql import query
from plugins.ray_heads import ray_in_this_process

pytestmark = pytest.mark.slow
TEXTS = [json.loads(line)["text"] for line in corpus_lines(0, 200)]


@pytest.fixture(scope="module")
def export_cache(tmp_path_factory):
    """One export cache for the module: each export is made once (about 10-30 s each here)."""
    return tmp_path_factory.mktemp("exports")


@pytest.fixture
def cache_env(export_cache, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(export_cache))
    return {"XDG_CACHE_HOME": str(export_cache)}


def resolved(backend: str = "torch", precision: str = "float32"):
    spec = manifest("x.jsonl", TORCH_MODEL)["spec"]
    return resolve_model(parse_spec(merged(spec, {"model": {"backend": backend, "precision": precision}})).model)


@pytest.fixture(scope="module")
def torch_vectors():
    return load_model(resolved(), "cpu").encode(TEXTS, batch_size=32, normalize_embeddings=True)


def cosines(model, reference: np.ndarray) -> np.ndarray:
    vectors = model.encode(TEXTS, batch_size=32, normalize_embeddings=True).astype(np.float32)
    return (vectors * reference).sum(axis=1)


def test_openvino_float32_vectors_match_torch(cache_env, torch_vectors):
    model_spec = resolved("openvino")
    directory = export_model(model_spec)
    assert (directory / "openvino" / "openvino_model.xml").is_file()
    assert export_model(model_spec) == directory  # cached: exported once
    assert cosines(load_model(model_spec, "cpu", directory, threads=2), torch_vectors).min() > 0.999


def test_openvino_int8_stays_within_the_quality_target(cache_env, torch_vectors):
    model_spec = resolved("openvino", "int8")
    directory = export_model(model_spec)
    float_weights = export_model(resolved("openvino")) / "openvino" / "openvino_model.bin"
    assert (directory / "openvino" / "openvino_model.bin").stat().st_size < float_weights.stat().st_size / 2
    found = cosines(load_model(model_spec, "cpu", directory, threads=2), torch_vectors)
    assert found.mean() >= 0.99 and found.min() >= 0.97, (found.mean(), found.min())
    assert found.mean() < 0.99999  # quantized: not the float model again


def test_onnx_float32_is_the_model_itself_and_int8_stays_within_the_quality_target(cache_env, torch_vectors):
    float_spec, int8_spec = resolved("onnx"), resolved("onnx", "int8")
    float_dir, int8_dir = export_model(float_spec), export_model(int8_spec)
    float_model = load_model(float_spec, "cpu", float_dir, threads=2)
    assert type(float_model).__name__ == "OnnxSentenceModel"  # onnxruntime itself, no optimum
    vectors = float_model.encode(TEXTS, batch_size=32, normalize_embeddings=True)
    assert np.abs(vectors - torch_vectors).max() < 1e-5
    # int8 matrix products, the attention's query, key and value projections among them (30: 5 in each of 6
    # layers), except each layer's feed-forward projection back down; then fused
    graph = onnx.load(str(int8_dir / "onnx" / "model.onnx")).graph
    constant = {w.name for w in graph.initializer}
    float_products = [n.name for n in graph.node if n.op_type == "MatMul" and n.input[1] in constant]
    ops = [node.op_type for node in graph.node]
    assert float_products == down_projections(graph) and len(float_products) == 6
    assert ops.count("MatMulInteger") == 30 and ops.count("MultiHeadAttention") == 6
    found = cosines(load_model(int8_spec, "cpu", int8_dir, threads=2), torch_vectors)
    assert found.mean() >= 0.99 and found.min() >= 0.97, (found.mean(), found.min())
    assert found.mean() < 0.99999  # quantized: not the float model again


def test_an_onnx_actor_embeds_the_model_s_vectors_without_importing_torch_or_transformers(
        export_cache, cache_env, torch_vectors):
    """The point of the onnx backend's own tokenizer: an actor's start is onnxruntime's, not torch's seconds."""
    import ray

    model_spec = resolved("onnx")
    exported = read_export(model_spec)
    with ray_in_this_process(cache_env):  # the actor's process writes the export into the test's cache
        actor = ray.remote(EmbeddingWorker).remote(model_spec, exported, 1, 0)
        result = ray.get(actor.embed.remote("b0", TEXTS[:40]), timeout=120)
        loaded = ray.get(actor.__ray_call__.remote(
            lambda _actor: sorted({"torch", "transformers", "sentence_transformers"} & sys.modules.keys())))
    assert loaded == []
    assert np.abs(result.vectors - torch_vectors[:40]).max() < 1e-5


def test_an_int8_job_below_its_min_cosine_is_refused_naming_both_figures_and_writes_nothing(
        tmp_path, database_url, cache_env, local_ray):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 40))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(merged(manifest(str(source), TORCH_MODEL), {"spec": {"model": {
        "backend": "onnx", "precision": "int8", "minCosine": 0.9999}}})))
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(job), "--database-url", database_url], cache_env, 600)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
    assert "PrecisionBelowMinimum: spec.model.minCosine 0.9999: precision int8 gave a mean cosine of 0.99" in \
        result.stdout, result.stdout
    assert "over the job's first 40 texts" in result.stdout
    assert query(database_url, "SELECT count(*) FROM embeddings") == [(0,)]
    [(state, reason, mean, least)] = query(database_url, "SELECT state, reason, precision_cosine_mean, "
                                                         "precision_cosine_min FROM embedjob_runs")
    assert (state, reason) == ("failed", "PrecisionBelowMinimum") and 0.99 < mean < 0.9999 and 0.9 < least <= mean


def test_vectors_of_each_backend_and_precision_are_kept_apart(tmp_path, database_url, cache_env, local_ray):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 64))
    quantized, plain = tmp_path / "openvino-int8.yaml", tmp_path / "torch.yaml"
    quantized.write_text(yaml.safe_dump(merged(manifest(str(source), TORCH_MODEL), {"spec": {"model": {
        "backend": "openvino", "precision": "int8"}}})))
    plain.write_text(yaml.safe_dump(manifest(str(source), TORCH_MODEL)))
    base_revision, model_name = resolved().revision, resolved().name

    first = run_on_ray(local_ray, [*EMBEDJOB, "run", str(quantized), "--database-url", database_url], cache_env, 600)
    assert first.returncode == 0, first.stdout + first.stderr
    assert query(database_url, "SELECT revision, count(*) FROM embeddings GROUP BY 1") == \
        [(f"{base_revision}+openvino-int8", 64)]
    written = query(database_url, "SELECT record_id, embedding::text FROM embeddings ORDER BY 1")

    # the same job with torch float32: another revision, so not a resume of the int8 run
    refused = run_on_ray(local_ray, [*EMBEDJOB, "run", str(plain), "--database-url", database_url], cache_env)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert f"model.revision changed from '{base_revision}+openvino-int8' to '{base_revision}'" in refused.stdout
    anew = run_on_ray(local_ray, [*EMBEDJOB, "run", str(plain), "--new-run", "--database-url", database_url], cache_env)
    assert anew.returncode == 0, anew.stdout + anew.stderr
    assert "records embedded   64" in anew.stdout
    assert query(database_url, "SELECT revision, count(*) FROM embeddings GROUP BY 1 ORDER BY 1") == \
        [(base_revision, 64), (f"{base_revision}+openvino-int8", 64)]
    assert query(database_url, "SELECT record_id, embedding::text FROM embeddings WHERE revision LIKE '%+%' "
                               "ORDER BY 1") == written  # not overwritten
    runs = query(database_url, "SELECT revision, state, precision_cosine_mean IS NOT NULL FROM embedjob_runs "
                               "WHERE state <> 'failed' ORDER BY started_at")
    # the gate measured the int8 run (and passed it at the default minCosine), not the float32 one
    assert runs == [(f"{base_revision}+openvino-int8", "succeeded", True), (base_revision, "succeeded", False)]

    # search reads the collection's ready revision (the float32 run's, the last to complete) only; --incoming reads
    # the manifest's, embedding the query with its backend and precision
    first_text = TEXTS[0]
    retired = run([*EMBEDJOB, "search", str(quantized), first_text, "--database-url", database_url], env=cache_env)
    assert retired.returncode == 1, retired.stdout + retired.stderr
    assert (f"the ready revision of collection 'cli' in table public.embeddings is {model_name}@{base_revision}, "
            f"not this manifest's {model_name}@{base_revision}+openvino-int8 (retired)") in retired.stderr
    found = run([*EMBEDJOB, "search", str(quantized), first_text, "-k", "1", "--incoming", "--database-url",
                 database_url], env=cache_env)
    assert found.returncode == 0, found.stderr
    distance, record_id, _ = found.stdout.strip().splitlines()[1].split(maxsplit=2)
    assert record_id == json.loads(corpus_lines(0, 1)[0])["id"] and float(distance) < 0.01


def test_a_half_precision_job_on_a_ray_without_gpus_is_refused_naming_the_field(tmp_path, database_url, local_ray):
    source = write_input(tmp_path / "peps.jsonl", corpus_lines(0, 10))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(merged(manifest(str(source), TORCH_MODEL), {"spec": {
        "model": {"precision": "float16"}, "workers": {"gpusPerActor": 1}}})))
    result = run_on_ray(local_ray, [*EMBEDJOB, "run", str(job), "--database-url", database_url])
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert "NoGPU: spec.model.precision float16 runs on a GPU and the Ray cluster has none" in result.stdout
