"""No database password in anything a job prints or stores, for URLs with it in the query string
(`password`, `sslpassword`) or with an unescaped `@` in it (issue 27 item 3): real PostgreSQL, real Ray,
the driver's entrypoint as the RayJob runs it and `embedjob run`."""

import json
import secrets

import pytest
import yaml

from embedjob.contract import encode_job_config
from support.cli import DRIVER, EMBEDJOB, manifest, run
from support.sql import query

pytestmark = pytest.mark.slow

QUERY_PASSWORD = f"qpw{secrets.token_hex(6)}"
SSL_PASSWORD = f"sslpw{secrets.token_hex(6)}"
# libpq ends the userinfo at the first `@`: the rest of this password becomes part of the host name.
AT_BEFORE, AT_AFTER = f"atpre{secrets.token_hex(6)}", f"atpost{secrets.token_hex(6)}"
ALL_SECRETS = (QUERY_PASSWORD, SSL_PASSWORD, AT_BEFORE, AT_AFTER)


def with_query_passwords(url: str) -> str:
    """`url` with a password and an sslpassword in its query (the test server trusts local sockets)."""
    return f"{url}{'&' if '?' in url else '?'}password={QUERY_PASSWORD}&sslpassword={SSL_PASSWORD}"


def table_job(name: str) -> dict:
    job = manifest("unused")
    job["metadata"]["name"] = name
    job["spec"]["source"] = {"table": {"name": "docs", "idColumn": "id", "textColumn": "body"},
                             "databaseSecretRef": {"name": "cms-db", "key": "dsn"}}
    return job


def leaks(text: str) -> list[str]:
    return [secret for secret in ALL_SECRETS if secret in text]


def test_no_password_from_a_urls_query_or_after_an_unescaped_at_is_printed_or_stored(
        ray_address, database_url, tmp_path):
    sink_url = with_query_passwords(database_url)
    source_url = f"postgresql://cms:{AT_BEFORE}@{AT_AFTER}@127.0.0.1:1/cms?sslpassword={SSL_PASSWORD}"
    printed: dict[str, str] = {}

    # A file job embedded to the end: its log (the Ray job log `embedjob logs` shows) has driver_starting.
    texts = tmp_path / "in.jsonl"
    texts.write_text("".join(json.dumps({"id": f"r{i}", "text": f"text number {i}"}) + "\n" for i in range(5)))
    file_job = manifest(str(texts))
    file_job["metadata"]["name"] = "secrets-file"
    done = run([*DRIVER, "--config-b64", encode_job_config(file_job), "--ray-address", ray_address],
               env={"EMBEDJOB_DATABASE_URL": sink_url}, timeout=600)
    printed["file job"] = done.stdout + done.stderr
    assert done.returncode == 0, printed["file job"][-3000:]
    assert "event=driver_starting" in done.stderr and "password=***&sslpassword=***" in done.stderr

    # A table job whose source database cannot be reached: libpq's error names the host it resolved,
    # which holds the end of the password; the run row keeps that error.
    refused = run([*DRIVER, "--config-b64", encode_job_config(table_job("secrets-table")),
                   "--ray-address", ray_address],
                  env={"EMBEDJOB_DATABASE_URL": sink_url, "EMBEDJOB_SOURCE_DATABASE_URL": source_url}, timeout=600)
    printed["table job"] = refused.stdout + refused.stderr
    assert refused.returncode == 1, printed["table job"][-3000:]

    # The same table job through `embedjob run`: its banner and its summary.
    path = tmp_path / "table-job.yaml"
    path.write_text(yaml.safe_dump(table_job("secrets-cli")))
    cli = run([*EMBEDJOB, "run", str(path), "--database-url", sink_url, "--source-database-url", source_url],
              timeout=600)
    printed["embedjob run"] = cli.stdout + cli.stderr
    assert cli.returncode == 1, printed["embedjob run"][-3000:]
    assert "password=***&sslpassword=***" in cli.stderr  # the banner names the database, masked

    errors = {name: error for name, error in query(database_url, "SELECT job_name, error FROM embedjob_runs")}
    assert errors["secrets-file"] is None
    for name in ("secrets-table", "secrets-cli"):
        assert "failed to resolve host '***@127.0.0.1'" in errors[name], errors[name]
    stored = {table: json.dumps([list(map(str, row)) for row in query(database_url, f"SELECT * FROM {table}")])
              for (table,) in query(database_url, "SELECT table_name FROM information_schema.tables "
                                                  "WHERE table_schema = 'public' AND table_name LIKE 'embedjob%'")}
    found = {where: leaks(text) for where, text in {**printed, **stored}.items() if leaks(text)}
    assert found == {}, found
