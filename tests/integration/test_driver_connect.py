"""The driver's connect to Ray is bounded: an address that accepts TCP but never speaks Ray is exit 3, in time."""

import socket
import threading
import time

import pytest

from embedjob.contract import encode_job_config
from support.cli import DRIVER, manifest, run


@pytest.fixture
def silent_listener():
    """A loopback address that accepts connections and never answers (a stalled GCS, a wrong port)."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:  # closed at teardown
                return

    threading.Thread(target=accept, daemon=True).start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()
    for conn in accepted:
        conn.close()


def test_a_ray_address_that_never_answers_exits_3_within_the_connect_timeout(silent_listener, tmp_path):
    ray_tmp = tmp_path / "ray"
    ray_tmp.mkdir()
    env = {"EMBEDJOB_DATABASE_URL": "postgresql://u:secret@127.0.0.1:1/db", "RAY_TMPDIR": str(ray_tmp)}
    config = encode_job_config(manifest("s3://bucket/in.jsonl"))
    started = time.monotonic()
    result = run([*DRIVER, "--config-b64", config, "--ray-address", silent_listener, "--ray-connect-timeout", "15"],
                 env=env, timeout=120)
    waited = time.monotonic() - started
    assert result.returncode == 3, result.stderr[-2000:]
    assert f"cannot connect to the Ray cluster at {silent_listener}: no connection after 15s" in result.stderr
    assert 15 <= waited < 45, waited
    assert "secret" not in result.stderr + result.stdout


def test_a_table_source_of_its_own_database_without_its_url_exits_2_and_never_reads_the_sinks():
    """Issue 26 item 3: spec.source.databaseSecretRef set and EMBEDJOB_SOURCE_DATABASE_URL missing (a shared
    cluster that does not hand it over) is a config error, before any Ray or database connection."""
    job = manifest("unused")
    job["spec"]["source"] = {"table": {"name": "docs", "idColumn": "id", "textColumn": "body"},
                             "databaseSecretRef": {"name": "cms-db", "key": "dsn"}}
    env = {"EMBEDJOB_DATABASE_URL": "postgresql://u:secret@127.0.0.1:1/db", "EMBEDJOB_SOURCE_DATABASE_URL": ""}
    result = run([*DRIVER, "--config-b64", encode_job_config(job), "--ray-address", "127.0.0.1:1"], env=env,
                 timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "spec.source.databaseSecretRef is set and EMBEDJOB_SOURCE_DATABASE_URL is not" in result.stderr
    assert "secret" not in result.stderr + result.stdout
