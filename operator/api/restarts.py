"""spec.restartSchedule: rolling restarts of the pods at an interval, optionally only in a daily window.

vLLM's memory grows over a long run; a restart every few hours bounds it. The operator does the restart as
`kubectl rollout restart` does (a pod template annotation), so it rolls under spec.rollout and drains every
old pod; the arithmetic is in reconcile/restarts.py.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import ClassVar, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import ConfigDict, Field, field_validator, model_validator

from .base import ApiModel
from .rules import (
    MSG_RESTART_EVERY,
    MSG_RESTART_WINDOW,
    RESTART_EVERY_MAX,
    RESTART_EVERY_MIN,
    RESTART_EVERY_PATTERN,
    RESTART_SCHEDULE_RULES,
    RESTART_WINDOW_RULES,
    validations,
)

CLOCK_PATTERN = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
TIME_ZONE_PATTERN = r"^[A-Za-z][-+_/A-Za-z0-9]*$"
_UNITS = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> timedelta:
    """A Go duration of hours, minutes and seconds (12h, 90m, 1h30m) as a timedelta."""
    if not re.match(RESTART_EVERY_PATTERN, text):
        raise ValueError(f"{text!r} is not a duration of hours, minutes and seconds (e.g. 12h or 1h30m)")
    return timedelta(seconds=sum(int(n) * _UNITS[u] for n, u in re.findall(r"([0-9]+)([hms])", text)))


def time_zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (from the system's database or the tzdata package)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"{name!r} is not a known IANA time zone (e.g. UTC or Europe/Berlin)") from exc


class DailyWindow(ApiModel):
    """What a daily window (RestartWindow, scaling.WarmWindow) checks: a known time zone, a start and an end
    that differ (`EMPTY`: the message when they do not). Each subclass declares start and end with its own
    descriptions."""

    EMPTY: ClassVar[str]
    start: str
    end: str
    time_zone: str = Field(
        default="UTC",
        min_length=1,
        max_length=64,
        pattern=TIME_ZONE_PATTERN,
        description="IANA time zone of start and end (e.g. Europe/Berlin), daylight saving time included.",
    )

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        time_zone(value)
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> Self:
        if self.start == self.end:
            raise ValueError(self.EMPTY)
        return self

    @property
    def zone(self) -> ZoneInfo:
        return time_zone(self.time_zone)

    @property
    def start_minute(self) -> int:
        """`start` as minutes after midnight."""
        return _minutes(self.start)

    @property
    def end_minute(self) -> int:
        return _minutes(self.end)


def _minutes(clock: str) -> int:
    hour, minute = (int(part) for part in clock.split(":"))
    return hour * 60 + minute


class RestartWindow(DailyWindow):
    """The daily window restarts wait for."""

    model_config = ConfigDict(json_schema_extra=validations(RESTART_WINDOW_RULES))
    EMPTY: ClassVar[str] = MSG_RESTART_WINDOW

    start: str = Field(
        max_length=5,
        pattern=CLOCK_PATTERN,
        description="When the window opens each day, HH:MM (24-hour) in timeZone.",
    )
    end: str = Field(
        max_length=5,
        pattern=CLOCK_PATTERN,
        description="When it closes, HH:MM, exclusive; earlier than start for a window across midnight "
        "(e.g. 22:00 to 04:00). A restart starts inside the window; its rollout may run past the end.",
    )


class RestartSchedule(ApiModel):
    """Scheduled rolling restarts of every pod (like `kubectl rollout restart`)."""

    model_config = ConfigDict(json_schema_extra=validations(RESTART_SCHEDULE_RULES))

    every: str = Field(
        max_length=32,
        pattern=RESTART_EVERY_PATTERN,
        description=f"Time between restarts, {RESTART_EVERY_MIN} to {RESTART_EVERY_MAX}, in hours, minutes "
        "and seconds (e.g. 12h or 1h30m). Counted from the last restart (scheduled or `kubectl rollout "
        "restart`), or, before the first, from when the operator first saw the schedule (the service's "
        "creation, or when the schedule was added): adding a schedule never restarts at once.",
    )
    window: RestartWindow | None = Field(
        default=None, description="Restart only within this daily window (a due restart waits for it)."
    )

    @field_validator("every")
    @classmethod
    def _bounded(cls, value: str) -> str:
        if (
            not parse_duration(RESTART_EVERY_MIN)
            <= parse_duration(value)
            <= parse_duration(RESTART_EVERY_MAX)
        ):
            raise ValueError(MSG_RESTART_EVERY)
        return value

    @property
    def interval(self) -> timedelta:
        return parse_duration(self.every)
