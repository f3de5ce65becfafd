"""Cron expressions as batch/v1 CronJob reads them, and their ticks in a time zone (pure functions).

Five fields (minute, hour, day of month, month, day of week) with `*`, `?`, lists, ranges,
steps (`*/15`, `5/15` = `5-59/15`), month and day names (`jan`, `mon`) and the macros
`@yearly` `@annually` `@monthly` `@weekly` `@daily` `@midnight` `@hourly`, as the parser
Kubernetes uses (robfig/cron's standard parser). When both day fields are restricted a day
matches either (`0 0 1 * mon`: the 1st and every Monday); when one starts with `*` or `?`
(and no step) only the other counts. A `TZ=` prefix is refused: the zone is its own field.

Ticks are minutes of the zone's wall clock. A wall time that a daylight-saving change skips
does not tick; one that it repeats ticks once, at its first occurrence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *", "@weekly": "0 0 * * 0",
          "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}
MONTHS = {name: number for number, name in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), start=1)}
WEEKDAYS = {name: number for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
#: (name, least, greatest, names) of the five fields
FIELDS = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, MONTHS),
          ("day of week", 0, 7, WEEKDAYS))
# A schedule that does not tick within this many years never will (29 February ticks every 4 or 8 years).
HORIZON_YEARS = 9
_PART = re.compile(r"^(?P<range>\*|\?|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/(?P<step>[0-9]+))?$")


class CronError(ValueError):
    """An expression or time zone that is not a schedule; the message names the part."""


@dataclass(frozen=True)
class Cron:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    any_day: bool  # the day of month field is * or ?: only the day of week counts
    any_weekday: bool

    def matches_day(self, day: datetime) -> bool:
        if day.month not in self.months:
            return False
        in_days, in_weekdays = day.day in self.days, (day.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return in_days and in_weekdays
        return in_days or in_weekdays


def parse(expression: str) -> Cron:
    """The schedule of a cron expression; CronError naming the field that is wrong."""
    if not isinstance(expression, str) or len(expression) > 256:
        raise CronError("a cron expression is a string of at most 256 characters")
    text = expression.strip().lower()
    if text.startswith(("tz=", "cron_tz=")):
        raise CronError("TZ= in the expression is not supported: set schedule.timeZone")
    text = MACROS.get(text, text)
    if text.startswith("@"):
        raise CronError(f"unknown macro {expression.strip()[:32]!r}; known: {', '.join(MACROS)}")
    parts = text.split()
    if len(parts) != 5:
        raise CronError(f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), "
                        f"this one has {len(parts)}")
    values, stars = [], []
    for part, (name, least, greatest, names) in zip(parts, FIELDS):
        field, star = _field(part, name, least, greatest, names)
        values.append(field)
        stars.append(star)
    minutes, hours, days, months, weekdays = values
    weekdays = frozenset(day % 7 for day in weekdays)  # 7 is Sunday too
    return Cron(minutes, hours, days, months, weekdays, any_day=stars[2], any_weekday=stars[4])


def _field(text: str, name: str, least: int, greatest: int, names: dict[str, int]) -> tuple[frozenset[int], bool]:
    """(the values of one field, whether it is an unstepped * or ?)."""
    values: set[int] = set()
    star = False
    for part in text.split(","):
        match = _PART.match(part)
        if match is None:
            raise CronError(f"{name}: {part[:32]!r} is not a value, range or step")
        step = int(match["step"]) if match["step"] is not None else 1
        if not 1 <= step <= greatest:
            raise CronError(f"{name}: step {match['step'][:8]} is not between 1 and {greatest}")
        if match["range"] in ("*", "?"):
            start, end = least, greatest
            star = star or match["step"] is None
        else:
            start_text, _, end_text = match["range"].partition("-")
            start = _value(start_text, name, least, greatest, names)
            # "N/step" means N up to the greatest value, every step
            end = _value(end_text, name, least, greatest, names) if end_text else (
                greatest if match["step"] is not None else start)
            if start > end:
                raise CronError(f"{name}: range {match['range']!r} runs backwards")
        values.update(range(start, end + 1, step))
    return frozenset(values), star


def _value(text: str, name: str, least: int, greatest: int, names: dict[str, int]) -> int:
    if text in names:
        return names[text]
    if not text.isascii() or not text.isdigit() or len(text) > 4:
        raise CronError(f"{name}: {text[:32]!r} is not a number{' or a name' if names else ''}")
    if not least <= int(text) <= greatest:
        raise CronError(f"{name}: {text} is not between {least} and {greatest}")
    return int(text)


def zone(name: str | None) -> ZoneInfo | timezone:
    """The IANA time zone `name` (unset: UTC, as the API server's own CronJob controller runs); CronError if unknown."""
    if not name:
        return timezone.utc
    if not re.fullmatch(r"[A-Za-z0-9_+-]+(/[A-Za-z0-9_+-]+)*", name) or len(name) > 64:
        raise CronError(f"time zone {name[:64]!r} is not an IANA zone name (e.g. Europe/Berlin)")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise CronError(f"unknown time zone {name!r} (an IANA zone name, e.g. Europe/Berlin)") from None


def next_tick(cron: Cron, tz: ZoneInfo | timezone, after: datetime) -> datetime | None:
    """The first tick strictly after `after` (an aware time), in UTC; None when there is none within HORIZON_YEARS."""
    local = after.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0) + timedelta(minutes=1)
    limit = local + timedelta(days=366 * HORIZON_YEARS)
    while local < limit:
        if not cron.matches_day(local):
            local = (local + timedelta(days=1)).replace(hour=0, minute=0)
        elif local.hour not in cron.hours:
            local = (local + timedelta(hours=1)).replace(minute=0)
        elif local.minute not in cron.minutes:
            local += timedelta(minutes=1)
        else:
            moment = _moment(local, tz)
            if moment is not None and moment > after:
                return moment
            local += timedelta(minutes=1)
    return None


def _moment(local: datetime, tz: ZoneInfo | timezone) -> datetime | None:
    """The UTC moment of a wall time in `tz` (its first occurrence); None when the zone skips it."""
    moment = local.replace(tzinfo=tz, fold=0).astimezone(timezone.utc)
    return moment if moment.astimezone(tz).replace(tzinfo=None) == local else None


def previous_tick(cron: Cron, tz: ZoneInfo | timezone, at_or_before: datetime) -> datetime | None:
    """The latest tick at or before `at_or_before`, in UTC; None when there is none within HORIZON_YEARS."""
    local = at_or_before.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0)
    limit = local - timedelta(days=366 * HORIZON_YEARS)
    while local > limit:
        if not cron.matches_day(local):
            local = local.replace(hour=23, minute=59) - timedelta(days=1)
        elif local.hour not in cron.hours:
            local = local.replace(minute=59) - timedelta(hours=1)
        elif local.minute not in cron.minutes:
            local -= timedelta(minutes=1)
        else:
            moment = _moment(local, tz)
            if moment is not None and moment <= at_or_before:
                return moment
            local -= timedelta(minutes=1)
    return None


def latest_missed(cron: Cron, tz: ZoneInfo | timezone, after: datetime, until: datetime,
                  count_up_to: int = 100) -> tuple[datetime | None, int]:
    """(the latest tick in (after, until], how many ticks that interval holds, counted up to `count_up_to` + 1:
    more than `count_up_to` reads as "too many")."""
    latest = previous_tick(cron, tz, until)
    if latest is None or latest <= after:
        return None, 0
    count, tick = 0, next_tick(cron, tz, after)
    while tick is not None and tick <= latest and count <= count_up_to:
        count += 1
        tick = next_tick(cron, tz, tick)
    return latest, count
