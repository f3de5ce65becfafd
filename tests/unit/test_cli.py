"""`embedjob run` and the cluster-mode entrypoint as subprocesses that refuse a bad manifest or an
unreachable Ray, the masking of secrets in log records, and the progress bar's batch estimate."""

import json
import logging
import time

import yaml

from embedjob.contract import encode_job_config
from support.cli import DRIVER, EMBEDJOB, manifest, run
from support.net import free_port
from embedjob_worker.plan.batching import estimated_batches, make_batches
from embedjob_worker.core.logs import SecretMaskingFilter, mask_text, mask_url
from embedjob_worker.core.records import Record


def test_a_manifest_with_bad_fields_exits_2_naming_the_fields(tmp_path):
    path = tmp_path / "bad.yaml"
    bad = manifest("in.jsonl", batchSize=0)
    del bad["spec"]["sink"]
    path.write_text(yaml.safe_dump(bad))
    result = run([*EMBEDJOB, "run", str(path)])
    assert result.returncode == 2, result.stderr
    assert "spec.batching.batchSize" in result.stderr and "spec.sink" in result.stderr

    entrypoint = run([*DRIVER, "--config-b64", encode_job_config(bad)], env={"EMBEDJOB_DATABASE_URL": "postgresql://x"})
    assert entrypoint.returncode == 2
    assert "spec.batching.batchSize: Input should be greater than or equal to 1" in entrypoint.stderr


def test_names_the_api_server_would_refuse_are_refused_locally(tmp_path):
    for metadata, field in (({"name": "Quick_Start"}, "metadata.name"),
                            ({"name": "ok", "namespace": "Team.A"}, "metadata.namespace")):
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump({**manifest("in.jsonl"), "metadata": metadata}))
        result = run([*EMBEDJOB, "run", str(path)])
        assert result.returncode == 2, result.stderr
        assert f"{field}: must be a lowercase RFC 1123" in result.stderr


def test_cluster_mode_fails_fast_on_an_unreachable_ray_and_starts_no_local_ray(tmp_path):
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    env = {"EMBEDJOB_DATABASE_URL": "postgresql://u:secret@127.0.0.1:1/db", "RAY_TMPDIR": str(ray_tmp)}
    config = encode_job_config(manifest("s3://bucket/in.jsonl"))
    address = f"127.0.0.1:{free_port()}"  # nothing listens there once the probe socket closed
    started = time.monotonic()
    result = run([*DRIVER, "--config-b64", config, "--ray-address", address], env=env, timeout=60)
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 30
    assert f"cannot reach the Ray cluster at {address}" in result.stderr
    assert "secret" not in result.stderr + result.stdout
    assert list(ray_tmp.iterdir()) == []  # no Ray session was started here

    no_address = run([*DRIVER, "--config-b64", config], env={**env, "RAY_ADDRESS": ""}, timeout=60)
    assert no_address.returncode == 3 and "--ray-address" in no_address.stderr
    assert list(ray_tmp.iterdir()) == []


def test_logs_mask_the_database_password():
    assert mask_url("postgresql://app:s3cr%21t@db:5432/vectors") == "postgresql://app:***@db:5432/vectors"
    record = logging.LogRecord("embedjob_worker", logging.INFO, __file__, 1, "connecting to %s", (
        "postgresql://app:s3cr%21t@db/vectors",), None)
    record.fields = {"error": "could not connect to postgresql://app:s3cr%21t@db/vectors"}
    SecretMaskingFilter(["postgresql://app:s3cr%21t@db/vectors"]).filter(record)
    assert "s3cr" not in record.getMessage() and "s3cr" not in json.dumps(record.fields)


def test_passwords_in_a_urls_query_or_after_an_unescaped_at_are_masked():
    """Issue 27 item 3: the query's password and sslpassword, and a userinfo password holding `@`."""
    assert mask_url("postgresql://app@db/v?sslmode=require&password=qs3cr&sslpassword=ss3cr") == \
        "postgresql://app@db/v?sslmode=require&password=***&sslpassword=***"
    assert mask_url("postgresql://app:before@after@db:5432/v") == "postgresql://app:***@db:5432/v"
    assert mask_url("host=db password='a b' dbname=v") == "host=db password=*** dbname=v"
    url = "postgresql://app:before@after@db:5432/v"
    # libpq reads `after@db` as the host and names it in its error
    masked = mask_text(f"failed to resolve host 'after@db': no such host; connecting to {url}", [url])
    assert masked == "failed to resolve host '***@db': no such host; connecting to postgresql://app:***@db:5432/v"
    assert mask_text("postgresql://x:y@h/d?PassWord=z1 and password='q r'", []) == \
        "postgresql://x:***@h/d?PassWord=*** and password=***"


def test_the_progress_estimate_counts_the_batches_make_batches_cuts():
    for records, batch_size, sort_window in ((230, 32, 100), (200, 32, 4096), (64, 16, 0), (1, 64, 64), (0, 8, 16)):
        cut = list(make_batches((Record(i, f"r{i}", "x" * (i % 7 + 1)) for i in range(records)), batch_size,
                                sort_window, "key"))
        assert estimated_batches(records, batch_size, sort_window) == len(cut), (records, batch_size, sort_window)
