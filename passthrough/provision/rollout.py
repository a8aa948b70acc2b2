# SPDX-License-Identifier: Apache-2.0
"""The rolling host play's settings, read and checked the same way by ``passthrough provision``
(before anything runs) and by the collection's filters inside host.yml: the canary and the
batch size (a count of at least 1, or a share such as ``"20%"``), the failure limit (0 to 100)
and the reboot window (times of day, ``H:MM-H:MM``, which may cross midnight, optionally
followed by a time zone name; UTC without one). No Ansible import here."""

from __future__ import annotations

import re
from datetime import UTC, datetime, tzinfo
from typing import Any

from passthrough.errors import PassthroughError, echo

# the play's settings and their defaults (docs/fleet.md lists them)
PLAY_SETTINGS: dict[str, Any] = {
    "passthrough_canary": 1,
    "passthrough_batch": 5,
    "passthrough_max_fail_percentage": 0,
}
GUEST_POLICIES = ("refuse", "stop", "skip")

_COUNT = re.compile(r"^\s*(\d+)\s*(%?)\s*$")
_TIME = r"(\d{1,2}):(\d{2})"
_WINDOW = re.compile(rf"^\s*{_TIME}\s*-\s*{_TIME}\s*(?:\s(\S+))?\s*$")


class BadSetting(PassthroughError):
    """A rollout setting that cannot be used: the run is refused before anything runs."""


def count(name: str, value: Any) -> int | str:
    """A canary or batch size: an int >= 1, or a share "N%" with 0 < N <= 100 (as Ansible's
    ``serial`` reads it)."""
    text = str(value) if not isinstance(value, bool) else "?"
    match = _COUNT.match(text)
    if match is None or (
        not match.group(2) and int(match.group(1)) < 1
    ):  # 0 and negatives: Ansible would read them as "every host at once"
        raise BadSetting(
            f"{name}: {echo(text)} is not a number of hosts >= 1 or a share such as 20%"
        )
    number = int(match.group(1))
    if match.group(2):
        if not 0 < number <= 100:
            raise BadSetting(f"{name}: {echo(text)} is not a share between 1% and 100%")
        return f"{number}%"
    return number


def percent(name: str, value: Any) -> int:
    """The failure limit: a whole number from 0 to 100."""
    text = str(value) if not isinstance(value, bool) else "?"
    match = _COUNT.match(text)
    if match is None or match.group(2) or not 0 <= int(match.group(1)) <= 100:
        raise BadSetting(f"{name}: {echo(text)} is not a percentage from 0 to 100")
    return int(match.group(1))


def window(value: Any, name: str = "passthrough_reboot_window") -> tuple[int, int, tzinfo] | None:
    """(start, end, zone) in minutes after midnight; None for "" (any time)."""
    text = "" if value is None else str(value)
    if not text.strip():
        return None
    match = _WINDOW.match(text)
    bad = f"{name}: {echo(text)} is not a window of times of day such as 22:00-04:00"
    if match is None:
        raise BadSetting(bad + " (optionally followed by a time zone: 22:00-04:00 Europe/Berlin)")
    h1, m1, h2, m2, zone_name = match.groups()
    if int(h1) > 23 or int(h2) > 23 or int(m1) > 59 or int(m2) > 59:
        raise BadSetting(bad)
    start, end = int(h1) * 60 + int(m1), int(h2) * 60 + int(m2)
    if start == end:
        raise BadSetting(f"{name}: {echo(text)} is empty (it starts where it ends)")
    zone: tzinfo = UTC
    if zone_name and zone_name.upper() != "UTC":
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            zone = ZoneInfo(zone_name)
        except (ZoneInfoNotFoundError, ValueError):
            raise BadSetting(
                f"{name}: {echo(zone_name)} is no time zone this controller knows"
            ) from None
    return start, end, zone


def inside(value: Any, now: datetime | None = None) -> bool:
    """Whether ``now`` (an aware time; the current one by default) is inside the window,
    the end excluded; a window whose end is before its start crosses midnight."""
    parsed = window(value)
    if parsed is None:
        return True
    start, end, zone = parsed
    local = (now or datetime.now(UTC)).astimezone(zone)
    minute = local.hour * 60 + local.minute
    if start < end:
        return start <= minute < end
    return minute >= start or minute < end


def policy(value: Any, name: str = "passthrough_guests") -> str:
    text = str(value)
    if text not in GUEST_POLICIES:
        raise BadSetting(f"{name}: {echo(text)} is not one of {', '.join(GUEST_POLICIES)}")
    return text


def play_settings(values: dict[str, Any]) -> dict[str, Any]:
    """The play's settings from ``values`` (the defaults where unset), each checked."""
    merged = {**PLAY_SETTINGS, **{k: v for k, v in values.items() if k in PLAY_SETTINGS}}
    return {
        "passthrough_canary": count("passthrough_canary", merged["passthrough_canary"]),
        "passthrough_batch": count("passthrough_batch", merged["passthrough_batch"]),
        "passthrough_max_fail_percentage": percent(
            "passthrough_max_fail_percentage", merged["passthrough_max_fail_percentage"]
        ),
    }


def batch_seen(batch: list[str], hosts: list[str], canary: Any, size: Any) -> None:
    """Where the play's settings are set as host variables (the inventory, group_vars) but the
    batch Ansible made does not follow them, say so: Ansible reads a play's ``serial`` from
    extra vars only, so a ``passthrough_batch: 10`` in group_vars would be ignored without a
    word. ``canary``/``size``: the variables as the batch's first host sees them (None: unset).
    Shares are not checked (Ansible rounds them)."""
    if not batch or batch[0] not in hosts:
        return
    first = hosts.index(batch[0])
    name, value = ("passthrough_canary", canary) if first == 0 else ("passthrough_batch", size)
    if value is None or "%" in str(value):
        return
    wanted = min(int(count(name, value)), len(hosts) - first)
    if len(batch) != wanted:
        raise BadSetting(
            f"{name} is {echo(str(value))} for these hosts but this batch has {len(batch)}: "
            "Ansible reads a play's serial from extra vars only; give it with -e (passthrough "
            "provision reads it from the inventory and does so)"
        )
