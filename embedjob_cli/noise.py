"""What the libraries under `embedjob` print on their own, silenced unless --verbose: the terminal shows the command's lines."""

from __future__ import annotations

import logging
import os
import warnings

import platformdirs

# Ray announces token authentication on every local start; a one-machine Ray on loopback
# is what `embedjob run` always starts, so the notice says nothing to act on.
_RAY_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
# transformers reads its level from this once, when it is first imported (by `embedjob search`, and by the
# run's Ray workers, which inherit the environment): its LOAD REPORT table is a warning.
_TRANSFORMERS_VERBOSITY = "TRANSFORMERS_VERBOSITY"


def quiet_libraries(verbose: bool) -> None:
    """Silence the libraries' own notices (their errors still show); with `verbose`, leave them as they are."""
    if verbose:
        return
    # pgserver asks platformdirs for a runtime dir, which warns (once, in several wordings) when
    # XDG_RUNTIME_DIR is unset or unusable, and falls back to a directory of its own that works.
    runtime_dir_warning = getattr(platformdirs, "RuntimeDirWarning", None)
    if runtime_dir_warning is not None:
        warnings.filterwarnings("ignore", category=runtime_dir_warning)
    else:  # a platformdirs from before the category: its one wording
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
    logging.getLogger(_RAY_TOKEN_NOTICE_LOGGER).setLevel(logging.ERROR)
    os.environ.setdefault(_TRANSFORMERS_VERBOSITY, "error")

