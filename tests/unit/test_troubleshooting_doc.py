"""docs/troubleshooting.md against the code it describes: the exit codes and their status reasons, the
default time a finished job's cluster is kept, the `embedjob logs` command; and the pages that link to it."""

from __future__ import annotations

import re

from embedjob import api
from embedjob.contract import EXIT_REASONS, ExitCode
from embedjob.contract import LOGS_HINT
from support.paths import REPO

DOC = REPO / "docs" / "troubleshooting.md"


def test_the_exit_code_table_is_the_contracts():
    rows = re.findall(r"^\| (\d) \| [^|]+ \| ([^|]+) \|$", DOC.read_text(), re.M)
    assert [int(code) for code, _ in rows] == [int(code) for code in ExitCode]
    for code, reason in rows:
        if ExitCode(int(code)) in EXIT_REASONS:
            assert reason.strip() == f"`{EXIT_REASONS[ExitCode(int(code))]}`", (code, reason)


def test_the_default_ttl_and_the_logs_command_are_the_codes():
    text = DOC.read_text()
    assert api.DEFAULT_TTL_SECONDS_AFTER_FINISHED == 10 * 60 and "**10 minutes when unset**" in text
    command = re.search(r"`(embedjob logs [^`]+)`", LOGS_HINT).group(1)
    assert command.split()[:2] == ["embedjob", "logs"] and "embedjob logs NAME" in text
    assert "docs/troubleshooting.md" in LOGS_HINT


def test_the_page_is_linked_from_the_readme_and_the_operator_and_install_guides():
    for page, link in (("README.md", "docs/troubleshooting.md"), ("docs/operator.md", "troubleshooting.md"),
                       ("docs/install.md", "troubleshooting.md")):
        assert f"]({link})" in (REPO / page).read_text(), page
