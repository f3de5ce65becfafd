"""The schedule's plan (controller.schedule_plan): CronJob's rules for ticks, deadlines, concurrency and history."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from controller.schedule_plan import Run, ScheduleSpec, plan, run_name

T0 = datetime(2026, 12, 5, 10, 0, tzinfo=timezone.utc)
EVERY_MINUTE = ScheduleSpec(cron="* * * * *")


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def test_nothing_is_due_before_the_first_tick_after_creation():
    p = plan("sync", EVERY_MINUTE, False, T0 + timedelta(seconds=10), None, [], T0 + timedelta(seconds=50))
    assert p.start is None and p.next_tick == T0 + minutes(1) and p.look_again_s == 10


def test_the_due_tick_starts_a_run_named_by_its_minute():
    p = plan("sync", EVERY_MINUTE, False, T0, None, [], T0 + minutes(1) + timedelta(seconds=3))
    assert (p.start, p.start_name, p.missed) == (T0 + minutes(1), f"sync-{int((T0 + minutes(1)).timestamp()) // 60}", 1)
    assert p.next_tick == T0 + minutes(2) and p.look_again_s == 5  # the run it starts is active: its end matters


def test_a_tick_already_started_is_not_started_again():
    tick = T0 + minutes(1)
    runs = [Run(run_name("sync", tick), tick)]
    assert plan("sync", EVERY_MINUTE, False, T0, None, runs, tick + timedelta(seconds=5)).start is None


def test_after_a_restart_only_the_latest_missed_tick_starts():
    p = plan("sync", EVERY_MINUTE, False, T0, T0 + minutes(1), [], T0 + minutes(7) + timedelta(seconds=30))
    assert (p.start, p.missed, p.events) == (T0 + minutes(7), 6, [])


def test_more_than_a_hundred_missed_ticks_say_so_and_start_the_latest():
    p = plan("sync", EVERY_MINUTE, False, T0, T0, [], T0 + minutes(500))
    assert p.start == T0 + minutes(500) and p.missed == 101
    assert [reason for reason, _ in p.events] == ["TooManyMissedTimes"]


def test_a_starting_deadline_drops_older_ticks():
    spec = ScheduleSpec(cron="0 * * * *", starting_deadline_seconds=600)
    late = plan("sync", spec, False, T0 - minutes(1), None, [], T0 + minutes(11))  # the 10:00 tick is 11 min old
    assert late.start is None and [reason for reason, _ in late.events] == ["MissedSchedule"]
    in_time = plan("sync", spec, False, T0 - minutes(1), None, [], T0 + minutes(9))
    assert in_time.start == T0 and in_time.events == []


def test_forbid_waits_for_the_active_run_and_replace_deletes_it():
    active = Run("sync-1", T0, state="Running")
    forbid = plan("sync", EVERY_MINUTE, False, T0 - minutes(1), T0, [active], T0 + minutes(1))
    assert forbid.start is None and "sync-1 is active" in forbid.waiting and forbid.look_again_s == 5  # ACTIVE_LOOK_S
    # once it ends, the waiting tick starts (no deadline)
    done = Run("sync-1", T0, state="Complete", completed=T0 + minutes(2))
    assert plan("sync", EVERY_MINUTE, False, T0 - minutes(1), T0, [done], T0 + minutes(2) + timedelta(seconds=1)
                ).start == T0 + minutes(2)
    replace = plan("sync", ScheduleSpec(cron="* * * * *", concurrency_policy="Replace"), False, T0 - minutes(1), T0,
                   [active], T0 + minutes(1))
    assert replace.start == T0 + minutes(1) and replace.delete == ("sync-1",)


def test_suspend_starts_nothing_but_history_is_still_pruned():
    runs = [Run(f"sync-{i}", T0 + minutes(i), state="Complete") for i in range(5)]
    p = plan("sync", EVERY_MINUTE, True, T0, T0 + minutes(4), runs, T0 + minutes(10))
    assert p.start is None and p.delete == ("sync-0", "sync-1")  # 3 successful kept


def test_history_limits_delete_the_oldest_finished_runs_of_each_outcome():
    runs = ([Run(f"ok-{i}", T0 + minutes(i), state="Complete") for i in range(4)]
            + [Run(f"bad-{i}", T0 + minutes(i), state="Failed") for i in range(3)]
            + [Run("now", T0 + minutes(9), state="Running")])
    spec = ScheduleSpec(cron="0 0 1 1 *", successful_runs_history_limit=2, failed_runs_history_limit=0)
    assert plan("sync", spec, False, T0, T0 + minutes(9), runs, T0 + minutes(10)).delete == (
        "ok-0", "ok-1", "bad-0", "bad-1", "bad-2")


def test_the_pending_ticks_are_those_due_while_a_forbid_run_is_active():
    active = Run("sync-1", T0, state="Running")
    held = plan("sync", EVERY_MINUTE, False, T0 - minutes(1), T0, [active], T0 + minutes(3) + timedelta(seconds=30))
    assert held.waiting and (held.missed, held.pending) == (3, 3)  # of which only the latest will start
    deadline = ScheduleSpec(cron="* * * * *", starting_deadline_seconds=90)
    assert plan("sync", deadline, False, T0 - minutes(1), T0, [active], T0 + minutes(3) + timedelta(seconds=30)
                ).pending == 1  # the older two are past the deadline: missed for good, not pending
    flood = plan("sync", EVERY_MINUTE, False, T0 - minutes(1), T0, [active], T0 + minutes(500))
    assert flood.pending == 101  # more than MISSED_LIMIT


@pytest.mark.parametrize("why, suspended, concurrency, state", [
    ("the run ended: the latest tick starts", False, "Forbid", "Complete"),
    ("Replace starts the tick", False, "Replace", "Running"),
    ("a suspended schedule is paused, not behind", True, "Forbid", "Running"),
])
def test_no_tick_is_pending_when_the_due_one_starts_or_the_schedule_is_suspended(why, suspended, concurrency, state):
    spec = ScheduleSpec(cron="* * * * *", concurrency_policy=concurrency)
    p = plan("sync", spec, suspended, T0 - minutes(1), T0, [Run("sync-1", T0, state=state)], T0 + minutes(3))
    assert p.pending == 0, why


def test_no_tick_is_pending_before_one_is_due():
    active = Run("sync-1", T0, state="Running")
    assert plan("sync", EVERY_MINUTE, False, T0 - minutes(1), T0, [active], T0 + timedelta(seconds=30)).pending == 0
