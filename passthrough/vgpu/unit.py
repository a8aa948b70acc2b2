# SPDX-License-Identifier: Apache-2.0
"""Keeping a layout across reboots: nothing of it survives one (VFs, types, mdevs), so a
oneshot unit, ordered after NVIDIA's vGPU services and before any guest starts, re-applies
the recorded layout (``restore``) and logs each thing it did to the journal of systemd."""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

from passthrough.host.root import HostRoot

LAYOUT = "etc/passthrough/vgpu-layout.json"
UNIT_NAME = "passthrough-vgpu.service"
UNIT = f"etc/systemd/system/{UNIT_NAME}"


def unit_command() -> str:
    """The boot unit's ExecStart: this Python running this package's ``vgpu restore`` (the
    command line's and the host role's apply alike)."""
    return shlex.join([sys.executable, "-m", "passthrough", "vgpu", "restore"])


def unit_text(command: str) -> str:
    return f"""\
# Written by passthrough vgpu apply; passthrough vgpu undo removes it.
[Unit]
Description=Re-apply the vGPU layout recorded in /{LAYOUT}
After=nvidia-vgpud.service nvidia-vgpu-mgr.service
Wants=nvidia-vgpu-mgr.service
Before=libvirtd.service virtqemud.service libvirt-guests.service
ConditionPathExists=/{LAYOUT}

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart={command}

[Install]
WantedBy=multi-user.target
"""


def read_layout(root: HostRoot) -> dict[str, Any]:
    """The recorded layout: card address → {mode, enable_vfs, vgpus: [...]}."""
    text = root.read(LAYOUT)
    if text is None:
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"/{LAYOUT}: not JSON ({exc})") from None
    cards = data.get("cards") if isinstance(data, dict) else None
    if not isinstance(cards, dict):
        raise ValueError(f"/{LAYOUT}: no 'cards' object")
    return cards


Write = Callable[[str, str], str | None]  # (path, value) -> error


def _held(root: HostRoot, vgpus: list[Any]) -> list[bool]:
    """For each recorded vendor-VFIO vGPU: does its VF hold its type now?"""
    from passthrough.vgpu.discover import CURRENT

    return [
        (root.read(f"sys/bus/pci/devices/{v.get('vf')}/{CURRENT}") or "").strip()
        == str(v.get("type_id"))
        for v in vgpus
        if isinstance(v, dict) and not v.get("uuid")
    ]


def restore(
    root: HostRoot,
    enable: Callable[[str], str | None],
    write: Write,
    say: Callable[[str], None],
    heterogeneous: Callable[[str], str | None] = lambda _pf: "nvidia-smi is not run here",
) -> list[str]:
    """What the boot unit does, card by card and in this order: VFs enabled where the record
    says so and none exist; heterogeneous mode set where the record says so and none of the
    card's recorded types is in place yet (it is set before the first type write); each
    recorded type written where the VF does not hold it, each mdev created where it is gone.
    Returns what failed (each one said too); a thing already in place is left alone."""
    from passthrough.vgpu.discover import CURRENT, MDEV_TYPES, parent_dir

    failed: list[str] = []
    for pf, entry in sorted(read_layout(root).items()):
        vgpus = entry.get("vgpus", [])
        first = next((v.get("vf") for v in vgpus if isinstance(v, dict)), None)
        error = None
        if entry.get("enable_vfs") and first and not root.exists(f"sys/bus/pci/devices/{first}"):
            say(f"{pf}: enabling its VFs")
            error = enable(pf)
        if error is None and entry.get("heterogeneous") and not any(_held(root, vgpus)):
            say(f"{pf}: setting heterogeneous mode")
            error = heterogeneous(pf)
        if error:
            failed.append(f"{pf}: {error}")
            say(failed[-1])
            continue
        for v in vgpus:
            vf, tid, name, uuid = v.get("vf"), v.get("type_id"), v.get("type_name"), v.get("uuid")
            if uuid:
                if root.exists(f"sys/bus/mdev/devices/{uuid}"):
                    say(f"{vf}: mdev {uuid} ({name}) already there")
                    continue
                rel = f"{parent_dir(root, vf)}/{MDEV_TYPES}/nvidia-{tid}/create"
                error = write(rel, uuid)
            else:
                rel = f"sys/bus/pci/devices/{vf}/{CURRENT}"
                if (root.read(rel) or "").strip() == str(tid):
                    say(f"{vf}: {name} (id {tid}) already there")
                    continue
                error = write(rel, str(tid))
                if error is None and (root.read(rel) or "").strip() != str(tid):
                    error = f"the driver did not take type {tid}"
            if error:
                failed.append(f"{vf}: {name}: {error}")
                say(failed[-1])
            else:
                say(f"{vf}: {name} (id {tid}) {'created' if uuid else 'set'}")
    return failed
