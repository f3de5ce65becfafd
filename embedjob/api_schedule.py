"""The EmbeddingJob's `spec.schedule`: a cron schedule with CronJob's fields (the model; the rules: embedjob.cron)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from pydantic import Field, field_validator

from .api_base import ApiModel
from .cron import CronError, next_tick, parse, zone

# A run is a child EmbeddingJob named <job>-<minutes since the epoch> (8 digits until 2160): the job's name
# leaves room for it in 63 characters, as a CronJob's does.
MAX_SCHEDULED_NAME = 52
ZONE_NAME = r"^[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*$"


class Schedule(ApiModel):
    """Run the job on a schedule, as a CronJob runs Jobs: each tick starts a run, a child EmbeddingJob with the
    same spec (an incremental re-run: what changed is embedded), named <job>-<minutes since the epoch>
    (docs/schedules.md). spec.suspend pauses the schedule; a started run goes on."""

    cron: str = Field(min_length=1, max_length=256, description="When: five cron fields (minute hour day-of-month "
                      "month day-of-week), as CronJob reads them, or a macro (@hourly, @daily, @weekly, @monthly, "
                      "@yearly).")
    time_zone: str | None = Field(None, min_length=1, max_length=64, pattern=ZONE_NAME,
                                  description="The IANA time zone the cron fields are read in (e.g. Europe/Berlin). "
                                  "Unset: UTC.")
    concurrency_policy: Literal["Forbid", "Replace"] = Field(
        "Forbid", description="A tick while a run is active: Forbid waits for it to end (the tick starts then, "
        "within startingDeadlineSeconds); Replace deletes the active run and starts the tick's.")
    starting_deadline_seconds: int | None = Field(
        None, ge=1, le=31_536_000, strict=True, description="A tick not started within this many seconds (the "
        "operator was down, a Forbid wait) is missed, not started late. Unset: the latest missed tick starts.")
    successful_runs_history_limit: int = Field(3, ge=0, le=100, strict=True,
                                               description="Completed runs kept; older ones are deleted.")
    failed_runs_history_limit: int = Field(1, ge=0, le=100, strict=True,
                                           description="Failed runs kept; older ones are deleted.")

    @field_validator("cron")
    @classmethod
    def _a_schedule_that_ticks(cls, value: str) -> str:
        try:
            cron = parse(value)
        except CronError as exc:
            raise ValueError(str(exc)) from None
        if next_tick(cron, timezone.utc, datetime(2026, 1, 1, tzinfo=timezone.utc)) is None:
            raise ValueError("this schedule never ticks (e.g. 30 February)")
        return value

    @field_validator("time_zone")
    @classmethod
    def _a_known_zone(cls, value: str | None) -> str | None:
        try:
            zone(value)
        except CronError as exc:
            raise ValueError(str(exc)) from None
        return value
