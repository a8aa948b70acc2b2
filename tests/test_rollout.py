# SPDX-License-Identifier: Apache-2.0
"""The rolling play's settings as provision and the play's filters read them
(passthrough/provision/rollout.py, fleetvars.resolve): counts >= 1 or shares, a failure limit
of 0-100, and the reboot window as times of day, across midnight and in a named zone."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from passthrough.provision import rollout
from passthrough.provision.fleetvars import extra_values, resolve


def _at(hh: int, mm: int) -> datetime:
    return datetime(2026, 12, 6, hh, mm, tzinfo=UTC)


@pytest.mark.parametrize(
    ("window", "now", "inside"),
    [
        ("23:59-1:00", (19, 40), False),  # text comparison read this as inside
        ("23:59-1:00", (0, 30), True),
        ("23:59-1:00", (23, 59), True),
        ("23:59-1:00", (1, 0), False),  # the end is excluded
        ("22:00-04:00", (3, 59), True),
        ("9:00-17:00", (10, 0), True),  # one-digit hour: "10:00" < "9:00" as text
        ("9:00-17:00", (8, 59), False),
        ("02:00-03:00 Europe/Berlin", (1, 30), True),  # 02:30 in Berlin (UTC+1 in December)
        ("02:00-03:00 Europe/Berlin", (2, 30), False),
        ("", (12, 0), True),
    ],
)
def test_the_window_is_read_as_times_of_day(
    window: str, now: tuple[int, int], inside: bool
) -> None:
    assert rollout.inside(window, _at(*now)) is inside


@pytest.mark.parametrize(
    "window", ["25:00-1:00", "10-12", "22:00", "12:00-12:00", "1:60-2:00", "1:00-2:00 Mars/Base"]
)
def test_a_malformed_window_is_named(window: str) -> None:
    with pytest.raises(rollout.BadSetting) as err:
        rollout.window(window)
    assert str(err.value).startswith("passthrough_reboot_window: ")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("passthrough_canary", 0),
        ("passthrough_canary", -1),
        ("passthrough_batch", "0"),
        ("passthrough_batch", "0%"),
        ("passthrough_batch", "120%"),
        ("passthrough_batch", "ten"),
        ("passthrough_batch", True),
        ("passthrough_max_fail_percentage", -1),
        ("passthrough_max_fail_percentage", 101),
        ("passthrough_max_fail_percentage", "50%"),
    ],
)
def test_bad_play_settings_are_refused_naming_the_value(name: str, value: Any) -> None:
    with pytest.raises(rollout.BadSetting) as err:
        rollout.play_settings({name: value})
    assert str(err.value).startswith(f"{name}: ")


def test_good_play_settings_and_defaults() -> None:
    assert rollout.play_settings({}) == {
        "passthrough_canary": 1,
        "passthrough_batch": 5,
        "passthrough_max_fail_percentage": 0,
    }
    got = rollout.play_settings({"passthrough_batch": " 20% ", "passthrough_canary": "2"})
    assert got["passthrough_batch"] == "20%" and got["passthrough_canary"] == 2


def test_group_vars_are_honoured_and_extra_vars_win() -> None:
    hosts = {h: {"passthrough_batch": 10, "passthrough_canary": 2} for h in ("a", "b", "c")}
    assert resolve(hosts, {}) == {
        "passthrough_canary": 2,
        "passthrough_batch": 10,
        "passthrough_max_fail_percentage": 0,
    }
    extra = extra_values(["passthrough_batch=3", '{"passthrough_max_fail_percentage": 50}'])
    assert resolve(hosts, extra)["passthrough_batch"] == 3
    assert resolve(hosts, extra)["passthrough_max_fail_percentage"] == 50


def test_hosts_that_disagree_on_a_play_setting_are_refused() -> None:
    hosts: dict[str, dict[str, Any]] = {"a": {"passthrough_batch": 10}, "b": {}}
    with pytest.raises(rollout.BadSetting, match=r"^passthrough_batch: the hosts disagree"):
        resolve(hosts, {})


def test_each_hosts_window_and_guest_policy_are_checked() -> None:
    with pytest.raises(rollout.BadSetting, match=r"^b: passthrough_reboot_window: 24:00-1:00"):
        resolve({"a": {}, "b": {"passthrough_reboot_window": "24:00-1:00"}}, {})
    with pytest.raises(rollout.BadSetting, match=r"^a: passthrough_host_guests: kill is not"):
        resolve({"a": {"passthrough_host_guests": "kill"}}, {})
    assert resolve(
        {"a": {"passthrough_guests": "skip", "passthrough_reboot_window": "{{ w }}"}}, {}
    )


def test_a_batch_that_does_not_follow_the_hosts_settings_is_named() -> None:
    """ansible-playbook alone reads serial from -e only: a group_vars canary of 2 gave a
    canary of 1 without a word; the Batch task now stops the play naming it."""
    hosts = ["a", "b", "c", "d", "e"]
    rollout.batch_seen(["a", "b"], hosts, 2, None)  # followed
    rollout.batch_seen(["c", "d", "e"], hosts, 2, 5)  # the last batch holds what is left
    rollout.batch_seen(["a"], hosts, None, None)  # unset: the defaults
    rollout.batch_seen(["a"], hosts, "30%", None)  # shares: Ansible rounds them
    with pytest.raises(rollout.BadSetting, match=r"^passthrough_canary is 2 .* has 1: Ansible"):
        rollout.batch_seen(["a"], hosts, 2, None)
    with pytest.raises(rollout.BadSetting, match=r"^passthrough_batch is 10 .* has 3"):
        rollout.batch_seen(["b", "c", "d", "e"][:3], ["x", *hosts], 1, 10)
