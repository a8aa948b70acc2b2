# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""Filters of the rolling host play, run on the controller: its settings checked as
``passthrough provision`` checks them (passthrough/provision/rollout.py, one set of rules), the
reboot window read as times of day, and whether a collection the role may need is installed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleFilterError


def _checked(call: Callable[[], Any]) -> Any:
    from passthrough.provision.rollout import BadSetting

    try:
        return call()
    except BadSetting as exc:
        raise AnsibleFilterError(str(exc)) from None


def rollout_count(value: Any, name: str) -> Any:
    """A canary or batch size as Ansible's ``serial`` takes it, or the play stops naming it."""
    from passthrough.provision.rollout import count

    return _checked(lambda: count(name, value))


def rollout_percent(value: Any, name: str) -> int:
    from passthrough.provision.rollout import percent

    return int(_checked(lambda: percent(name, value)))


def rollout_batch(shown: dict[str, Any], canary: Any = None, size: Any = None) -> Any:
    """The Batch task's message, where the batch follows the play's settings as the hosts'
    variables give them; else the play stops here, before any host is touched."""
    from passthrough.provision.rollout import batch_seen

    _checked(lambda: batch_seen(list(shown["batch"]), list(shown["hosts"]), canary, size))
    return shown


def window_inside(value: Any) -> bool:
    """Whether now is inside the reboot window (True for "": any time)."""
    from passthrough.provision.rollout import inside

    return bool(_checked(lambda: inside(value)))


def guest_policy(value: Any) -> str:
    from passthrough.provision.rollout import policy

    return str(_checked(lambda: policy(value)))


def missing_collection(fqcn: str) -> str:
    """ "" where the module ``fqcn`` resolves on this controller, else the collection's name."""
    from ansible.plugins.loader import module_loader

    if module_loader.find_plugin_with_context(fqcn).resolved:
        return ""
    return ".".join(fqcn.split(".")[:2])


class FilterModule:
    def filters(self) -> dict[str, Callable[..., Any]]:
        return {
            "rollout_count": rollout_count,
            "rollout_percent": rollout_percent,
            "rollout_batch": rollout_batch,
            "window_inside": window_inside,
            "guest_policy": guest_policy,
            "missing_collection": missing_collection,
        }
