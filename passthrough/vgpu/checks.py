# SPDX-License-Identifier: Apache-2.0
"""``check``'s lines about vGPU: one a NVIDIA card, INFO (vGPU is optional for passthrough)."""

from __future__ import annotations

from passthrough.model import CheckResult, Level
from passthrough.vgpu.model import Mode, VgpuCard


def vgpu_checks(cards: tuple[VgpuCard, ...]) -> list[CheckResult]:
    out = []
    for c in cards:
        if c.mode is Mode.NONE:
            if c.total_vfs:  # SR-IOV capable: vGPU is near, say what is missing
                out.append(CheckResult("vgpu", Level.INFO, f"{c.address}: no vGPU: {c.why}"))
            continue
        free = sum(1 for vf in c.vfs if vf.free)
        used = [f"{vf.address} {vf.type_name or vf.type_id}" for vf in c.vfs if vf.type_id]
        held = f"; running vGPU guests: {', '.join(c.guests())}" if c.guests() else ""
        summary = (
            f"{c.address}: vGPU mode {c.mode.value} ({c.why}); {free} of {len(c.vfs)} free, "
            f"{len(c.types())} types creatable"
            + (f"; in use: {', '.join(used)}" if used else "")
            + held
        )
        out.append(CheckResult("vgpu", Level.PASS, summary))
    return out
