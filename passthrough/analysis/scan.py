# SPDX-License-Identifier: Apache-2.0
"""One host judged: every GPU's verdict and the readiness checks, what scan and check show."""

from __future__ import annotations

from passthrough.analysis.checks import run_checks
from passthrough.analysis.policy import judge_all
from passthrough.errors import PassthroughError, UnknownPciDevice
from passthrough.model import CheckResult, GpuVerdict, Host, Level, PciAddress
from passthrough.records import frozen


@frozen
class Scan:
    """A host with a verdict for each GPU and the readiness checks."""

    host: Host
    verdicts: list[GpuVerdict]
    checks: list[CheckResult]

    @property
    def failed(self) -> bool:
        return any(c.level is Level.FAIL for c in self.checks)


def analyse(host: Host) -> Scan:
    verdicts = judge_all(host)
    return Scan(host=host, verdicts=verdicts, checks=run_checks(host, verdicts))


def only(scan: Scan, wanted: list[PciAddress]) -> Scan:
    """The scan narrowed to the GPUs that hold ``wanted``; an address the host lacks, or
    one that belongs to no GPU, is refused by name."""
    known = {f.address for f in scan.host.functions}
    for a in wanted:
        if a not in known:
            raise UnknownPciDevice(str(a))
    verdicts = [v for v in scan.verdicts if any(f.address in wanted for f in v.gpu.functions)]
    for a in wanted:
        if not any(a in {f.address for f in v.gpu.functions} for v in verdicts):
            raise PassthroughError(f"{a} is not a function of a GPU (see `passthrough scan`)")
    return Scan(host=scan.host, verdicts=verdicts, checks=scan.checks)
