"""Dates as the app shows them: the chat list's groups and a message's time (English month
names, whatever the locale, as the rest of the app's text)."""

from __future__ import annotations

from datetime import date, datetime

MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def date_group(stamp: float, today: date) -> str:
    """The group of a chat last changed at `stamp` (seconds since the epoch, local time):
    Today, Yesterday, Previous 7 days, Previous 30 days, then its month (and year, where
    that is not this one)."""
    day = date.fromtimestamp(stamp)
    age = (today - day).days
    if age <= 0:  # today, or a clock set back since
        return "Today"
    if age == 1:
        return "Yesterday"
    if age < 7:
        return "Previous 7 days"
    if age < 30:
        return "Previous 30 days"
    month = MONTHS[day.month - 1]
    return month if day.year == today.year else f"{month} {day.year}"


def message_time(stamp: float, now: datetime) -> tuple[str, str]:
    """A message's time, short and in full: ("23:41", "5 December 2026, 23:41") today;
    ("4 Dec, 23:41", ...) earlier this year; ("4 Dec 2025, 23:41", ...) before."""
    when = datetime.fromtimestamp(stamp)
    clock = f"{when.hour:02d}:{when.minute:02d}"
    month = MONTHS[when.month - 1]
    full = f"{when.day} {month} {when.year}, {clock}"
    if when.date() == now.date():
        return clock, full
    if when.year == now.year:
        return f"{when.day} {month[:3]}, {clock}", full
    return f"{when.day} {month[:3]} {when.year}, {clock}", full
