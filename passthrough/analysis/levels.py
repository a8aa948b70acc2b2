# SPDX-License-Identifier: Apache-2.0
"""A finding's level in a check-style report (``check``, ``kubevirt preflight``): the one
severity the policy table gives its code (:mod:`passthrough.analysis.codes`), so the same
finding on the same host is a FAIL or a WARN alike in scan, check and preflight; and the
count of cards check gives from the same verdicts."""

from __future__ import annotations

from collections.abc import Collection

from passthrough.analysis import codes
from passthrough.analysis.codes import APU_IGPU, BMC_VGA, INTEL_IGPU
from passthrough.errors import count
from passthrough.model import CheckResult, GpuVerdict, Level

_LEVELS = {"error": Level.FAIL, "warning": Level.WARN, "info": Level.PASS}


def finding_level(code: str, overrides: Collection[str] = ()) -> Level:
    """FAIL for a refusal these flags do not lift, WARN for a warning, PASS for a note."""
    return _LEVELS[codes.severity(code, overrides)]


def gpus_check(verdicts: list[GpuVerdict]) -> CheckResult:
    """check's gpu-viable: the discrete cards that can be passed through, of all."""
    # an integrated GPU is no target (intel-igpu, apu-igpu): told apart, never counted
    igpus = [v for v in verdicts if {INTEL_IGPU, APU_IGPU} & set(v.codes)]
    candidates = [v for v in verdicts if BMC_VGA not in v.codes and v not in igpus]
    viable = [v for v in candidates if v.viable]
    besides = (
        f"; integrated {', '.join(str(v.gpu.address) for v in igpus)} not counted "
        "(this toolkit targets discrete cards)"
        if igpus
        else ""
    )
    if viable:
        return CheckResult(
            "gpu-viable",
            Level.PASS,
            f"{len(viable)} of {count(len(candidates), 'GPU')} can be passed through: "
            + ", ".join(str(v.gpu.address) for v in viable)
            + besides,
        )
    if not candidates:
        return CheckResult(
            "gpu-viable",
            Level.FAIL,
            "no GPU that could be passed through" + besides,
            "install a GPU in a slot with its own IOMMU group",
        )
    return CheckResult(
        "gpu-viable",
        Level.FAIL,
        # a BMC's VGA is the host's console, not a GPU anyone would pass through: not counted
        "the only GPU cannot be passed through alone" + besides
        if len(candidates) == 1
        else f"none of {len(candidates)} GPUs can be passed through alone" + besides,
        "see `passthrough scan` for the reasons; a slot with its own IOMMU group fixes most",
    )
