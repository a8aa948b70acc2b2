# SPDX-License-Identifier: Apache-2.0
"""The rollout settings as the user wrote them, wherever Ansible reads variables: the inventory,
group_vars and host_vars (through ``ansible-inventory --list``, which merges them as a play
would) and ``-e``, which wins. ``passthrough provision`` checks every one before anything runs
(a bad value: exit 2, naming it) and hands the play's own (canary, batch, failure limit) to
ansible-playbook as extra vars: Ansible itself reads a play's ``serial`` from extra vars only,
so a ``passthrough_batch: 10`` in group_vars would otherwise be ignored without a word."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from passthrough.errors import PassthroughError, echo, echo_path
from passthrough.provision import rollout

ROLLING_GROUP = "gpu_hosts"  # host.yml's hosts
# per host: (the role's variable, the inventory-wide one its default reads)
HOST_SETTINGS = {
    "window": ("passthrough_host_reboot_window", "passthrough_reboot_window"),
    "guests": ("passthrough_host_guests", "passthrough_guests"),
}


def _ansible_inventory() -> str:
    here = Path(sys.executable).parent / "ansible-inventory"
    return str(here) if here.exists() else "ansible-inventory"


def inventory_hosts(inventory: str, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Each host of the rolling group with its variables (group_vars and host_vars merged)."""
    try:
        proc = subprocess.run(
            [_ansible_inventory(), "-i", inventory, "--list"],
            capture_output=True,
            text=True,
            env={**os.environ, **env, "ANSIBLE_NOCOLOR": "1"},
            check=False,
        )
    except OSError as exc:
        raise PassthroughError(f"ansible-inventory cannot run: {exc.strerror}") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        raise PassthroughError(
            f"inventory {echo_path(inventory)}: "
            + (echo(lines[0].strip()) if lines else f"ansible-inventory exited {proc.returncode}")
        )
    data = json.loads(proc.stdout or "{}")
    hostvars: dict[str, dict[str, Any]] = (data.get("_meta") or {}).get("hostvars") or {}
    names: list[str] = []
    todo, seen = [ROLLING_GROUP], set()
    while todo:
        group = todo.pop(0)
        if group in seen:
            continue
        seen.add(group)
        entry = data.get(group) or {}
        names += [h for h in entry.get("hosts") or [] if h not in names]
        todo += entry.get("children") or []
    return {name: hostvars.get(name) or {} for name in names}


def extra_values(items: list[str], cwd: str | None = None) -> dict[str, Any]:
    """What the ``-e`` forms set, in order (later wins), as ansible-playbook reads them:
    ``k=v ...`` (strings), ``@file`` and inline JSON/YAML."""
    values: dict[str, Any] = {}
    for item in items:
        text = item.strip()
        if text.startswith("@"):
            path = Path(cwd or os.getcwd()) / os.path.expanduser(text[1:])
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        elif text.startswith(("{", "[")):
            loaded = yaml.safe_load(text)
        else:
            loaded = dict(w.split("=", 1) for w in shlex.split(text) if "=" in w)
        if isinstance(loaded, dict):
            values.update(loaded)
    return values


def _templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def resolve(hosts: dict[str, dict[str, Any]], extra: dict[str, Any]) -> dict[str, Any]:
    """The play's settings (each checked) from ``extra``, else the hosts' variables, which must
    agree (one play, one ``serial``); every host's window and guest policy checked too."""
    settings: dict[str, Any] = {}
    for name, default in rollout.PLAY_SETTINGS.items():
        if name in extra:
            settings[name] = extra[name]
            continue
        values = {h: v[name] for h, v in hosts.items() if name in v}
        distinct = {json.dumps(v, sort_keys=True, default=str) for v in values.values()}
        if len(distinct) > 1 or (values and len(values) < len(hosts)):
            shown = ", ".join(f"{h}: {values.get(h, default)}" for h in list(hosts)[:3])
            raise rollout.BadSetting(
                f"{name}: the hosts disagree ({shown}, ...); it is one setting of the rolling "
                f"play: set it for the whole {ROLLING_GROUP} group or with -e"
            )
        settings[name] = next(iter(values.values()), default)
    for name in list(settings):
        if _templated(settings[name]):
            del settings[name]  # the play's filter checks it once Ansible has templated it
    checked = rollout.play_settings(settings)
    for host, values in hosts.items():
        merged = {**values, **extra}
        for own, shared in HOST_SETTINGS.values():
            key = own if own in merged else shared
            value = merged.get(key)
            if value is None or _templated(value):
                continue
            try:
                if own == "passthrough_host_guests":
                    rollout.policy(value, key)
                else:
                    rollout.window(value, key)
            except rollout.BadSetting as exc:
                raise rollout.BadSetting(f"{host}: {exc}") from None
    return {k: v for k, v in checked.items() if k in settings}
