"""What a scheduled EmbeddingJob does now: which tick to start a run for, which runs to delete (pure).

A scheduled job starts one child EmbeddingJob per tick (as a CronJob starts Jobs), named
`<job>-<minutes since the epoch of the tick>`, so a tick is started at most once even when the
operator restarts between the create and the status write. The rules are CronJob's:

- the tick started is the latest one due since the last scheduled tick (or the job's creation);
  with `startingDeadlineSeconds`, only ticks at most that old count, and older ones are missed;
- `Forbid`: while a run is active the due tick waits (it starts when the run ends, if still within
  its deadline); `Replace`: the active run is deleted and the tick's run started;
- `suspend` starts nothing; runs already started go on;
- finished runs beyond `successfulRunsHistoryLimit` / `failedRunsHistoryLimit` are deleted, oldest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from embedjob.api_status import JobState
from embedjob.cron import latest_missed, next_tick, parse, zone

from .times import rfc3339

FINISHED = (JobState.complete.value, JobState.failed.value)
# Look again at least this often (a clock step, an operator that missed a wake-up), at most this rarely.
LOOK_AGAIN_S = (1.0, 300.0)
# How often a schedule with an active run is looked at.
ACTIVE_LOOK_S = 5.0
# More missed ticks than this are reported as too many (CronJob's limit); the latest still starts.
MISSED_LIMIT = 100


@dataclass(frozen=True)
class ScheduleSpec:
    """spec.schedule as the plan reads it."""

    cron: str
    time_zone: str | None = None
    concurrency_policy: str = "Forbid"
    starting_deadline_seconds: int | None = None
    successful_runs_history_limit: int = 3
    failed_runs_history_limit: int = 1


@dataclass(frozen=True)
class Run:
    """A child job the schedule started."""

    name: str
    scheduled: datetime
    state: str | None = None
    completed: datetime | None = None

    @property
    def finished(self) -> bool:
        return self.state in FINISHED


@dataclass(frozen=True)
class Plan:
    start: datetime | None = None  #: the tick to start a run for
    start_name: str | None = None
    delete: tuple[str, ...] = ()  #: runs to delete: the replaced active one, and history beyond the limits
    missed: int = 0  #: ticks due since the last one scheduled (MISSED_LIMIT + 1: more than the limit)
    waiting: str | None = None  #: why a due tick is not started now (Forbid)
    next_tick: datetime | None = None
    look_again_s: float = LOOK_AGAIN_S[1]
    events: list[tuple[str, str]] = field(default_factory=list)  #: (reason, message) worth an Event

    @property
    def pending(self) -> int:
        """The ticks due and not started while one waits (`missed`, Forbid), else 0: at most one of them will
        start (the latest due when the active run ends). A started tick, one past startingDeadlineSeconds and a
        suspended schedule's are no backlog."""
        return self.missed if self.waiting else 0


def run_name(job: str, tick: datetime) -> str:
    return f"{job}-{int(tick.timestamp()) // 60}"


def plan(job: str, spec: ScheduleSpec, suspended: bool, created: datetime, last_scheduled: datetime | None,
         runs: list[Run], now: datetime) -> Plan:
    """What to do at `now` (all times aware)."""
    cron, tz = parse(spec.cron), zone(spec.time_zone)
    upcoming = next_tick(cron, tz, now)
    look_again = LOOK_AGAIN_S[1] if upcoming is None else (upcoming - now).total_seconds()
    look_again = min(max(look_again, LOOK_AGAIN_S[0]), LOOK_AGAIN_S[1])
    delete = _beyond_history(runs, spec)
    active = [run for run in runs if not run.finished]
    if active:  # its end may put a run beyond the history limits, or let a held tick start
        look_again = min(look_again, ACTIVE_LOOK_S)
    if suspended:
        return Plan(delete=delete, next_tick=upcoming, look_again_s=look_again)
    since = last_scheduled or created
    events = []
    if spec.starting_deadline_seconds is not None:
        earliest = now - timedelta(seconds=spec.starting_deadline_seconds)
        if since < earliest:
            skipped, _ = latest_missed(cron, tz, since, earliest, 0)
            if skipped is not None:
                events.append(("MissedSchedule", f"tick {rfc3339(skipped)} is past startingDeadlineSeconds "
                               f"({spec.starting_deadline_seconds}); it is not started"))
            since = earliest
    tick, missed = latest_missed(cron, tz, since, now, MISSED_LIMIT)
    if tick is None:
        return Plan(delete=delete, next_tick=upcoming, look_again_s=look_again, events=events)
    name = run_name(job, tick)
    if any(run.name == name for run in runs):  # started before a restart that lost the status write
        return Plan(delete=delete, next_tick=upcoming, look_again_s=look_again, events=events)
    if missed > MISSED_LIMIT:
        events.append(("TooManyMissedTimes", f"more than {MISSED_LIMIT} ticks were missed; only the latest, "
                       f"{rfc3339(tick)}, is started (set startingDeadlineSeconds to bound them)"))
    if active and spec.concurrency_policy == "Forbid":
        return Plan(delete=delete, missed=missed, next_tick=upcoming, events=events,
                    waiting=f"run {active[0].name} is active (concurrencyPolicy Forbid): tick {rfc3339(tick)} "
                    "starts when it ends", look_again_s=look_again)
    replaced = tuple(run.name for run in active) if spec.concurrency_policy == "Replace" else ()
    return Plan(start=tick, start_name=name, delete=replaced + delete, missed=missed, next_tick=upcoming,
                look_again_s=min(look_again, ACTIVE_LOOK_S), events=events)  # the started run is active


def _beyond_history(runs: list[Run], spec: ScheduleSpec) -> tuple[str, ...]:
    """Finished runs beyond the history limits, oldest first."""
    doomed = []
    for state, keep in ((JobState.complete.value, spec.successful_runs_history_limit),
                        (JobState.failed.value, spec.failed_runs_history_limit)):
        done = sorted((run for run in runs if run.state == state), key=lambda run: run.scheduled, reverse=True)
        doomed += [run.name for run in reversed(done[keep:])]
    return tuple(doomed)
