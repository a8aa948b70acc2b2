# SPDX-License-Identifier: Apache-2.0
"""What every lab stage stands on: the lab machine's fixed facts (the stand-in card, the
negative case, the paths inside the lab host), the failure every stage raises, and
``LabCore``: the machine, the commands run inside it over SSH (each one logged), the stage
timer, the drivers read from sysfs, and the artifacts kept when a stage fails.

The stages themselves are in stage_one.py (image, boot, scan, bind), stage_fleet.py (the
host and vm playbooks), stage_nested.py (the nested guest that boots), stage_admin.py (the
admin's own edit) and stage_undo.py (the break, undo, back); run.py puts them together.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import machine

REPO = Path(__file__).resolve().parents[1]
CARD = "0000:01:00.0"
CARD_FUNCTIONS = ["0000:01:00.0", "0000:01:00.1"]
NEGATIVE = "0000:02:01.0"
NEGATIVE_PEER = "0000:02:02.0"
# no_timer_check: see image.GRUB_DEFAULTS
APPEND = "root=/dev/vda rw console=ttyS0 no_timer_check intel_iommu=on iommu=pt"
SRC = "/opt/passthrough-src"
# the venv the collection installs the controller's library into (passthrough_runtime)
VENV = "/opt/passthrough/venv"
# Where scripts/setup.sh test names a file here, it exists (holding this process's id) while a
# nested guest boots, and the tests run beside the lab start no new test meanwhile
# (tests/conftest.py): TCG inside TCG slows down three- to fourfold beside any busy thread,
# even one at nice 19 (docs/lab.md, the nested row)
ALONE = "PASSTHROUGH_LAB_ALONE"


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """The machine to this process while the block runs, where the run beside it asks."""
    path = os.environ.get(ALONE)
    if not path:
        yield
        return
    Path(path).write_text(f"{os.getpid()}\n")
    try:
        yield
    finally:
        Path(path).unlink(missing_ok=True)


GUEST = "lab-guest"
COMPANION = CARD_FUNCTIONS[1]  # the card's second function (a USB controller)
BIG = "0000:03:00.0"  # the large-BAR stand-in (ivshmem-plain, BAR2 64 GiB)
NESTED = "lab-nested"
IMAGES = "/var/lib/libvirt/images"
NESTED_MIB = 256
# The break's guest CPU bits: a count OVMF does not trust from any vendor, so it falls back
# to its 32 GiB window (TCG's "max" CPU says AuthenticAMD, whose 40 bits OVMF does trust).
BREAK_BITS = 38
# TCG inside TCG: the planned guest took 453 s at load 2, about 18 min beside the rest of the
# suite, and ran past 1,500 s (its capture half printed) with two more TCG guests beside it
NESTED_TIMEOUT = 2100
# The admin's edit after apply: a dotted parameter no kernel code claims, which the kernel
# ignores and still shows in /proc/cmdline
ADMIN_ARG = "lab.admin_edit=1"
ADMIN_GRUB = "/etc/default/grub"
# the line the admin's sed edits: GRUB_CMDLINE_LINUX_DEFAULT with its value in double quotes
ADMIN_LINE = r'^(GRUB_CMDLINE_LINUX_DEFAULT="[^"]*)"$'


class LabFailed(Exception):
    pass


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def with_admin_edit(text: str) -> str:
    """``text`` (an /etc/default/grub) as the admin's sed leaves it: ``ADMIN_ARG`` at the end
    of the GRUB_CMDLINE_LINUX_DEFAULT line."""
    edited, n = re.subn(ADMIN_LINE, rf'\1 {ADMIN_ARG}"', text, flags=re.M)
    if n != 1:
        raise LabFailed(f"{ADMIN_GRUB} has no single GRUB_CMDLINE_LINUX_DEFAULT line: {text}")
    return edited


class LabCore:
    """The lab machine and what every stage does with it: run a command inside, time a
    stage, read drivers and PCI IDs, keep the artifacts, stop the machine."""

    boot_wait = 600.0  # seconds for the first SSH banner

    def __init__(self, work: Path, artifacts: Path, say: Callable[[str], None] = print) -> None:
        self.work = work
        self.artifacts = artifacts
        self.say = say
        self.timings: dict[str, float] = {}
        self.machine: machine.LabMachine | None = None
        self.log: list[str] = []
        self.ansible_logs: list[Path] = []
        self.accel = "tcg"
        self.baseline = ""
        self._inventory: Path | None = None
        self.artifact_files: list[Path] = []
        self.ours: list[str] = []  # the arguments our GRUB drop-in appends
        self.admin_grub = ""  # sha256 of /etc/default/grub as the admin's edit left it
        # the lab host's Python with the library: the system's in stage one (put there by
        # boot), the collection's venv in the full chain (installed by the host play)
        self.python = "python3"
        self.installed: dict[str, Any] = {}

    def stage(self, name: str, fn: Callable[[], Any]) -> Any:
        self.say(f"[lab] {name} ...")
        started = time.monotonic()
        try:
            return fn()
        finally:
            self.timings[name] = time.monotonic() - started
            self.say(f"[lab] {name} took {self.timings[name]:.1f}s")

    def sh(self, command: str, timeout: int = 1800) -> subprocess.CompletedProcess[str]:
        assert self.machine is not None
        r = self.machine.ssh(command, timeout=timeout)
        self.log.append(f"$ {command}\n[rc={r.returncode}]\n{r.stdout}\n{r.stderr}")
        return r

    def pt(self, args: str) -> subprocess.CompletedProcess[str]:
        return self.sh(f"{self.python} -m passthrough {args}")

    # every file under /etc and /boot with its checksum (the baseline undo is held to)
    FILES = "find /etc /boot -xdev -type f ! -path '/etc/ssh/*' ! -path '/etc/machine-id' -print0 | sort -z | xargs -0 sha256sum"

    def pci_id(self, address: str) -> str:
        sysfs = f"/sys/bus/pci/devices/{address}"
        vendor, device = self.sh(f"cat {sysfs}/vendor {sysfs}/device").stdout.split()
        return f"{vendor[2:]}:{device[2:]}"

    def drivers(self, addresses: list[str]) -> dict[str, str]:
        return {
            a: self.sh(
                f"basename $(readlink /sys/bus/pci/devices/{a}/driver 2>/dev/null) 2>/dev/null"
            ).stdout.strip()
            for a in addresses
        }

    def _guarded(self, stages: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run the stages; keep the artifacts on failure; stop the machine in any case."""
        try:
            return stages()
        except Exception as exc:
            self.keep_artifacts()
            died = self.machine.exit_status() if self.machine is not None else None
            if died:  # the lab machine itself is gone: that is the news, not the symptom
                raise LabFailed(f"{exc} — the lab machine's QEMU exited, {died}") from exc
            raise
        finally:
            if self.machine is not None:
                self.machine.stop()

    def keep_artifacts(self) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        for name in ("console.log", "qemu-stderr.log"):
            if (self.work / name).exists():
                shutil.copy(self.work / name, self.artifacts / name)
        (self.artifacts / "commands.log").write_text("\n".join(self.log))
        for log in [*self.ansible_logs, *self.artifact_files]:
            if log.exists():
                shutil.copy(log, self.artifacts / log.name)
        self.say(f"[lab] artifacts kept in {self.artifacts}")
