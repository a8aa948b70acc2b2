# SPDX-License-Identifier: Apache-2.0
"""After a reboot: is every vGPU the layout record names back where apply put it?

Each recorded vGPU is looked up in sysfs (never written): a vendor-VFIO VF's
``nvidia/current_vgpu_type``, an mdev's UUID under ``/sys/bus/mdev/devices`` and the type its
``mdev_type`` link names. Four answers: as recorded; reset to 0 (or, mdev, gone: the boot
unit did not run or failed); another type; the VF missing (SR-IOV not enabled after boot).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from passthrough.host.root import HostRoot
from passthrough.model import CheckResult, Level
from passthrough.records import frozen
from passthrough.vgpu.discover import CATALOG, CURRENT, parse_catalog
from passthrough.vgpu.unit import LAYOUT, UNIT_NAME, read_layout


class State(StrEnum):
    AS_RECORDED = "as-recorded"
    RESET = "reset"  # vendor VFIO: current_vgpu_type 0; mdev: the UUID is gone
    OTHER_TYPE = "other-type"
    VF_MISSING = "vf-missing"


WHY = {
    State.AS_RECORDED: "as recorded",
    State.RESET: f"reset to 0: the boot unit did not run or failed (journalctl -u {UNIT_NAME})",
    State.OTHER_TYPE: "another type than recorded: changed after apply (by hand, another tool)",
    State.VF_MISSING: (
        "VF missing: SR-IOV was not enabled after boot (the boot unit did not run, or "
        f"sriov-manage failed: journalctl -u {UNIT_NAME})"
    ),
}


@frozen(slots=True)
class Found:
    pf: str
    vf: str
    type_id: int  # as recorded
    type_name: str
    uuid: str | None
    state: State
    now_id: int | None = None  # what sysfs shows (None: nothing to read)
    now_name: str | None = None

    @property
    def ok(self) -> bool:
        return self.state is State.AS_RECORDED

    def line(self) -> str:
        what = f"{self.type_name} (id {self.type_id})" + (f" mdev {self.uuid}" if self.uuid else "")
        why = WHY[self.state]
        if self.state is State.OTHER_TYPE:
            why = f"holds {self.now_name or '?'} (id {self.now_id}), {why}"
        return f"{self.vf}  {what}: {why}"

    def to_json(self) -> dict[str, Any]:
        return {
            "pf": self.pf,
            "vf": self.vf,
            "type_id": self.type_id,
            "type_name": self.type_name,
            "uuid": self.uuid,
            "state": self.state.value,
            "now_type_id": self.now_id,
            "now_type_name": self.now_name,
            "ok": self.ok,
        }


def _names(root: HostRoot, pf: str) -> dict[int, str]:
    """Type names from the catalogs of the card's VFs (a configured VF's own may be empty;
    a type no VF still offers stays unnamed)."""
    out: dict[int, str] = {}
    devices = "sys/bus/pci/devices"
    for vf in root.listdir(devices):
        if root.link_name(f"{devices}/{vf}/physfn") != pf:
            continue
        rel = f"sys/bus/pci/devices/{vf}/{CATALOG}"
        for t in parse_catalog(root.read(rel) or "", rel):
            out.setdefault(t.id, t.name)
    return out


def _recorded(pf: str, v: dict[str, Any]) -> tuple[str, int, str]:
    tid = v.get("type_id")
    if not isinstance(tid, int) or isinstance(tid, bool) or not isinstance(v.get("vf"), str):
        raise ValueError(f"/{LAYOUT}: {pf}: a vGPU entry without its VF and type id")
    return str(v["vf"]), tid, str(v.get("type_name") or f"type {tid}")


def _vendor(root: HostRoot, pf: str, v: dict[str, Any], names: dict[int, str]) -> Found:
    vf, tid, name = _recorded(pf, v)
    if not root.exists(f"sys/bus/pci/devices/{vf}"):
        return Found(pf, vf, tid, name, None, State.VF_MISSING)
    now = root.read_int(f"sys/bus/pci/devices/{vf}/{CURRENT}") or 0
    state = State.AS_RECORDED if now == tid else State.RESET if now == 0 else State.OTHER_TYPE
    return Found(pf, vf, tid, name, None, state, now, names.get(now) if now else None)


def _mdev(root: HostRoot, pf: str, v: dict[str, Any]) -> Found:
    vf, tid, name = _recorded(pf, v)
    uuid = str(v["uuid"])
    dev = f"sys/bus/mdev/devices/{uuid}"
    if not root.exists(dev):
        parent = root.exists(f"sys/bus/pci/devices/{vf}")
        return Found(pf, vf, tid, name, uuid, State.RESET if parent else State.VF_MISSING)
    kind = root.link_name(f"{dev}/mdev_type") or ""
    now = int(kind[7:]) if kind.startswith("nvidia-") and kind[7:].isdigit() else 0
    state = State.AS_RECORDED if now == tid else State.OTHER_TYPE
    return Found(pf, vf, tid, name, uuid, state, now, None if now == tid else kind or None)


def verify_layout(root: HostRoot) -> list[Found] | None:
    """Each recorded vGPU and what sysfs shows of it; None when no layout is recorded.
    ValueError (one line) when the record is not readable."""
    if not root.exists(LAYOUT):
        return None
    out: list[Found] = []
    for pf, entry in sorted(read_layout(root).items()):
        given = entry.get("vgpus") if isinstance(entry, dict) else None
        vgpus = [v for v in given if isinstance(v, dict)] if isinstance(given, list) else []
        names = _names(root, pf)
        for v in vgpus:
            out.append(_mdev(root, pf, v) if v.get("uuid") else _vendor(root, pf, v, names))
    return out


def summary(found: list[Found]) -> str:
    good = sum(1 for f in found if f.ok)
    return f"{good} of {len(found)} recorded vGPU(s) as recorded"


def verify_check(found: list[Found]) -> CheckResult:
    """``passthrough verify``'s one line on the vGPU layout (``vgpu verify`` names each)."""
    bad = [f for f in found if not f.ok]
    if not bad:
        return CheckResult("vgpu", Level.PASS, summary(found))
    states = sorted({WHY[f.state].split(":")[0] for f in bad})
    return CheckResult(
        "vgpu",
        Level.FAIL,
        f"{summary(found)}; {', '.join(states)}: " + ", ".join(f.vf for f in bad),
        "`passthrough vgpu verify` names each; `passthrough vgpu restore` re-applies the layout",
    )


def layout_checks(root: HostRoot) -> list[CheckResult]:
    """``passthrough verify``'s line on the recorded vGPU layout; none where none is
    recorded, a FAIL naming the problem where the record cannot be read."""
    try:
        found = verify_layout(root)
    except ValueError as exc:
        return [CheckResult("vgpu", Level.FAIL, str(exc), "`passthrough vgpu undo` removes it")]
    return [] if found is None else [verify_check(found)]
