"""The unit tier: no services, and nothing heavy imported into the test process.

A session that ran only unit tests fails when it has imported Ray, torch,
sentence-transformers, kopf, the envtest harness or a service plugin.
"""

import sys
from pathlib import Path

import pytest

#: top-level modules a unit-tier session must not import
HEAVY_MODULES = ("ray", "torch", "sentence_transformers", "kopf", "envtest", "plugins")
UNIT_TIER = Path(__file__).resolve().parent


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not session.items or any(UNIT_TIER not in item.path.parents for item in session.items):
        return  # other tiers ran in this session too: they import what they need
    loaded = [name for name in HEAVY_MODULES if name in sys.modules]
    if loaded:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.line("")  # after the progress line
        reporter.write_sep("=", f"the unit tier imported {', '.join(loaded)}: move the test that needs it to "
                                "tests/integration or tests/cluster", red=True)
