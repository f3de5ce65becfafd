"""quiet_libraries: the libraries' own notices silenced for the CLI's commands, left as they are with --verbose."""

import os
import warnings

import platformdirs
import pytest

from embedjob_cli.noise import quiet_libraries


@pytest.fixture
def no_transformers_verbosity(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "restored after the test")
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY")


def _shown_after(verbose: bool) -> list[str]:
    """The warnings that show once quiet_libraries(verbose) has run: platformdirs' and another library's."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_libraries(verbose)
        warnings.warn("XDG_RUNTIME_DIR is not set, falling back to /tmp/runtime-0", platformdirs.RuntimeDirWarning)
        warnings.warn("/run/user/0 is owned by uid 1, not 0", platformdirs.RuntimeDirWarning)
        warnings.warn("a deprecation a user should see", UserWarning)
    return [str(warning.message) for warning in caught]


def test_the_runtime_dir_warning_in_any_wording_and_transformers_reports_are_silenced(no_transformers_verbosity):
    assert _shown_after(verbose=False) == ["a deprecation a user should see"]
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"


def test_verbose_leaves_the_libraries_as_they_are(no_transformers_verbosity):
    assert len(_shown_after(verbose=True)) == 3
    assert "TRANSFORMERS_VERBOSITY" not in os.environ


def test_a_users_own_transformers_verbosity_is_kept(monkeypatch):
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    _shown_after(verbose=False)
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
