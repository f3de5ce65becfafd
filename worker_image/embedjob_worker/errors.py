"""Why a job stops: a failed job (exit 1) or an unreachable Ray/database (exit 3)."""


class JobFailed(Exception):
    """The job ends failed; `reason` is CamelCase and goes into the run row."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


class Unreachable(Exception):
    """PostgreSQL (or, as RayUnreachable, Ray) cannot be reached; the run row may not be writable."""


class RayUnreachable(Unreachable):
    """The Ray cluster the driver was given cannot be reached (exit 3, never a local Ray instead)."""
