"""Cron expressions and their ticks (embedjob.cron) against CronJob's rules and a minute-by-minute reference."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from embedjob.cron import CronError, latest_missed, next_tick, parse, previous_tick, zone

UTC = timezone.utc


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC) if "+" not in text else datetime.fromisoformat(text)


def reference_ticks(expression: str, tz_name: str | None, start: datetime, minutes: int) -> list[datetime]:
    """Every UTC minute after `start` whose first wall-clock occurrence in the zone matches: by brute force."""
    cron, tz = parse(expression), zone(tz_name)
    seen_walls, ticks = set(), []
    first = start.replace(second=0, microsecond=0)
    for i in range(1, minutes + 1):
        moment = first + timedelta(minutes=i)
        wall = moment.astimezone(tz).replace(tzinfo=None)
        if wall in seen_walls:  # the hour a change to winter time repeats: ticked at its first occurrence
            continue
        seen_walls.add(wall)
        if _reference_day(expression, wall) and wall.hour in cron.hours and wall.minute in cron.minutes:
            ticks.append(moment)
    return ticks


def _reference_day(expression: str, wall: datetime) -> bool:
    """CronJob's day rule, from the expression's text: both day fields restricted, either matches."""
    cron, fields = parse(expression), expression.split()
    day_star, weekday_star = (field[0] in "*?" and "/" not in field for field in (fields[2], fields[4]))
    by_day, by_weekday = wall.day in cron.days, wall.isoweekday() % 7 in cron.weekdays
    either = by_day or by_weekday if not (day_star or weekday_star) else by_day and by_weekday
    return wall.month in cron.months and either


def ticks_of(expression: str, tz_name: str | None, start: datetime, minutes: int) -> list[datetime]:
    cron, tz = parse(expression), zone(tz_name)
    end, ticks, tick = start + timedelta(minutes=minutes), [], next_tick(cron, tz, start)
    while tick is not None and tick <= end:
        ticks.append(tick)
        tick = next_tick(cron, tz, tick)
    return ticks


@pytest.mark.parametrize("expression, after, expected", [
    ("*/15 * * * *", "2026-12-05T10:07:30", "2026-12-05T10:15:00"),
    ("5/15 * * * *", "2026-12-05T10:51:00", "2026-12-05T11:05:00"),  # N/step is N-59/step
    ("0 0 * * *", "2026-12-05T00:00:00", "2026-12-06T00:00:00"),  # strictly after
    ("@hourly", "2026-12-05T10:00:01", "2026-12-05T11:00:00"),
    ("@weekly", "2026-12-05T10:00:00", "2026-12-06T00:00:00"),  # 2026-12-06 is a Sunday
    ("0 9 * * MON-FRI", "2026-12-05T10:00:00", "2026-12-07T09:00:00"),
    ("0 0 1 * mon", "2026-12-02T00:00:00", "2026-12-07T00:00:00"),  # both restricted: either
    ("0 0 1 * *", "2026-12-02T00:00:00", "2027-01-01T00:00:00"),
    ("0 0 */2 * mon", "2026-12-02T00:00:00", "2026-12-03T00:00:00"),  # a step clears the star: either
    ("0 0 ? * 7", "2026-12-02T00:00:00", "2026-12-06T00:00:00"),  # 7 is Sunday; ? is *
    ("0 12 29 feb *", "2026-12-05T00:00:00", "2028-02-29T12:00:00"),
    ("30 23 31 dec *", "2026-12-31T23:30:00", "2027-12-31T23:30:00"),
])
def test_next_tick_in_utc(expression, after, expected):
    assert next_tick(parse(expression), zone(None), at(after)) == at(expected)


def test_a_zone_ticks_on_its_wall_clock_through_daylight_saving_changes():
    berlin = zone("Europe/Berlin")
    # 2027-03-28: 02:00 -> 03:00 (02:30 does not exist: no tick that day); 2027-10-31: 03:00 -> 02:00 (once)
    cron = parse("30 2 * * *")
    assert next_tick(cron, berlin, at("2027-03-27T12:00:00")) == at("2027-03-29T00:30:00")
    first = next_tick(cron, berlin, at("2027-10-30T12:00:00"))
    assert first == at("2027-10-31T00:30:00")  # 02:30 summer time (UTC+2), the first occurrence
    assert next_tick(cron, berlin, first) == at("2027-11-01T01:30:00")  # not 01:30 UTC on the 31st again
    # from inside the repeated hour's second pass (01:10 UTC is 02:10 CET): not back to 02:40 CEST before it
    assert next_tick(parse("40 2 * * *"), berlin, at("2027-10-31T01:10:00")) == at("2027-11-01T01:40:00")
    assert next_tick(parse("0 9 * * *"), zone("Asia/Kolkata"), at("2026-12-05T00:00:00")) == at("2026-12-05T03:30:00")


@settings(max_examples=60, deadline=None)
@given(minute=st.sampled_from(["*", "*/7", "0", "15,45", "10-20/5", "59"]),
       hour=st.sampled_from(["*", "*/5", "1-3", "2", "23", "0,12"]),
       day=st.sampled_from(["*", "?", "1", "*/10", "28-31", "15"]),
       month=st.sampled_from(["*", "3", "10,11", "feb-apr", "*/4"]),
       weekday=st.sampled_from(["*", "?", "0", "1-5", "sat,sun", "*/3"]),
       tz_name=st.sampled_from([None, "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"]),
       start=st.sampled_from(["2027-03-27T18:00:00", "2027-10-30T20:00:00", "2027-02-27T00:00:00",
                              "2026-12-31T22:00:00"]))
def test_ticks_are_the_minute_by_minute_references(minute, hour, day, month, weekday, tz_name, start):
    expression = f"{minute} {hour} {day} {month} {weekday}"
    assert ticks_of(expression, tz_name, at(start), 3 * 24 * 60) == reference_ticks(expression, tz_name, at(start),
                                                                                   3 * 24 * 60)


@settings(max_examples=40, deadline=None)
@given(expression=st.sampled_from(["*/7 * * * *", "0 */5 * * *", "30 2 * * *", "0 0 1,15 * mon", "15 3 29 feb *"]),
       tz_name=st.sampled_from([None, "Europe/Berlin", "Australia/Lord_Howe"]),
       offset_minutes=st.integers(0, 60 * 24 * 400))
def test_previous_tick_is_the_one_before_the_next(expression, tz_name, offset_minutes):
    cron, tz = parse(expression), zone(tz_name)
    moment = at("2026-01-01T00:00:00") + timedelta(minutes=offset_minutes, seconds=17)
    before = previous_tick(cron, tz, moment)
    assert before is not None and before <= moment
    assert next_tick(cron, tz, before) > moment


def test_latest_missed_counts_up_to_the_limit():
    cron, tz = parse("* * * * *"), zone(None)
    assert latest_missed(cron, tz, at("2026-12-05T10:00:00"), at("2026-12-05T10:00:59")) == (None, 0)
    assert latest_missed(cron, tz, at("2026-12-05T10:00:00"), at("2026-12-05T10:03:10")) == (
        at("2026-12-05T10:03:00"), 3)
    # a year down: the latest tick, and "more than 100" without walking every minute
    latest, count = latest_missed(cron, tz, at("2025-12-05T10:00:00"), at("2026-12-05T10:00:30"))
    assert (latest, count) == (at("2026-12-05T10:00:00"), 101)


@pytest.mark.parametrize("expression, message", [
    ("", "5 fields"), ("* * * *", "has 4"), ("* * * * * *", "has 6"),
    ("60 * * * *", "minute: 60 is not between 0 and 59"), ("* 24 * * *", "hour: 24"),
    ("* * 0 * *", "day of month: 0"), ("* * * 13 *", "month: 13"), ("* * * * 8", "day of week: 8"),
    ("*/0 * * * *", "step 0"), ("*/61 * * * *", "step 61"), ("5-1 * * * *", "backwards"),
    ("* * * jam *", "month: 'jam' is not a number or a name"), ("a * * * *", "minute: 'a' is not a number"),
    ("1,,2 * * * *", "minute: '' is not"), ("٣ * * * *", "minute"), ("-1 * * * *", "minute: '-1'"),
    ("TZ=UTC 0 * * * *", "schedule.timeZone"), ("CRON_TZ=UTC 0 * * * *", "schedule.timeZone"),
    ("@every 5m", "unknown macro"), ("@reboot", "unknown macro"), ("0 0 * * *" + " " * 300, "256"),
    ("99999999999999999999 * * * *", "minute"),
])
def test_hostile_expressions_are_refused_naming_the_part(expression, message):
    with pytest.raises(CronError, match=message.replace("(", r"\(").replace("*", r"\*").replace("?", r"\?")):
        parse(expression)


@pytest.mark.parametrize("name", ["Mars/Olympus", "../etc/passwd", "Europe/Berlin\n", "", "x" * 100, "UTC;rm"])
def test_unknown_or_hostile_zones_are_refused(name):
    if name == "":
        assert zone(name) == UTC
        return
    with pytest.raises(CronError, match="zone"):
        zone(name)


def test_a_schedule_that_never_ticks_has_no_next_tick():
    assert next_tick(parse("0 0 30 feb *"), zone(None), at("2026-12-05T00:00:00")) is None
    assert previous_tick(parse("0 0 31 apr *"), zone(None), at("2026-12-05T00:00:00")) is None
