"""What a snapshot records beyond discovery: what the other commands read from a root,
read once through the recorder while the snapshot is taken (nothing is run or written), so
that each command gives the same answer on the snapshot as on the root it came from."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from passthrough.host.snapshot import RecordingRoot
    from passthrough.model import Host


def record_plan(recorder: RecordingRoot, host: Host) -> None:
    """Also what ``plan`` reads beyond discovery (the bootloader's and initramfs tool's
    files, modprobe.d, the kernel's module lists, what was applied before), so that
    ``plan --root`` on the snapshot gives the plan it gives on the host: the default
    selection and each card alone (with its group) are planned, nothing is written."""
    from passthrough.analysis.viability import find_gpus
    from passthrough.errors import PassthroughError
    from passthrough.plan.build import PlanOptions, make_plan

    tries = [PlanOptions()] + [
        PlanOptions(gpus=(str(g.address),), include_group=True, allow_boot_gpu=True)
        for g in find_gpus(host)
    ]
    for opts in tries:
        try:
            make_plan(recorder, host, opts)
        except PassthroughError:
            continue  # a refused selection reads what it read; the others go on


def record_guest_check(recorder: RecordingRoot) -> None:
    """Inside a virtual machine, also what ``passthrough guest check`` reads (subsystem IDs,
    the driver's /proc files, /dev/nvidia*, runtime and Kubernetes configuration), so that
    ``guest check --root`` on the snapshot judges the hardware as it does on the guest. The
    checks run through the recorder with no command and no compute: only files are read."""
    from passthrough.guest.check import run_guest_checks
    from passthrough.guest.root import GuestRoot

    class Recorded(GuestRoot):
        """The guest check's reader, reading through the recorder (contained, recorded)."""

        def __init__(self) -> None:
            super().__init__(recorder.path)
            self.is_live = False  # a capture: nothing is run or probed

        def exists(self, rel: str) -> bool:
            return recorder.exists(rel)

        def isdir(self, rel: str) -> bool:
            return recorder.isdir(rel)

        def listdir(self, rel: str) -> list[str]:
            return recorder.listdir(rel)

        def read(self, rel: str) -> str | None:
            return recorder.read(rel)

        def link_name(self, rel: str) -> str | None:
            return recorder.link_name(rel)

        def real(self, rel: str, follow_final: bool = True) -> str:
            return recorder.real(rel, follow_final)

    run_guest_checks(Recorded(), lambda _argv: None, compute=False)
