# SPDX-License-Identifier: Apache-2.0
"""Stage one of the lab: the image (debootstrap once, then ext4), the boot under QEMU with
an emulated Intel IOMMU (KVM where a probe shows it works), the toolkit copied inside, then
`passthrough scan` and `passthrough bind` on the real kernel, the negative case refused."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import image
import machine
from labcore import (
    APPEND,
    CARD,
    CARD_FUNCTIONS,
    NEGATIVE,
    NEGATIVE_PEER,
    REPO,
    SRC,
    LabCore,
    LabFailed,
)


class StageOne(LabCore):
    """image, boot, scan, bind: the lab's first stage (and every boot the full chain makes)."""

    def _key(self) -> Path:
        """The SSH key root and the lab user log in with (made once per work directory)."""
        key = self.work / "id_lab"
        if not key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True
            )
        return key

    def build(self) -> tuple[Path, Path, Path, Path]:
        key = self._key()
        img, kernel, initrd = image.image(self.work, (self.work / "id_lab.pub").read_text())
        return img, kernel, initrd, key

    def boot(
        self,
        img: Path,
        kernel: Path | None,
        initrd: Path | None,
        key: Path,
        tree: Callable[[], Path] = image.tree,
        library: bool = True,
    ) -> float:
        """Start the machine (direct kernel boot, or UEFI from the disk when no kernel is
        given: the bootloader on its ESP), wait for sshd, and put the toolkit inside unless
        ``library`` is false (the full chain: the collection installs it). The KVM probe
        boots ``kernel``, or the newest one of the image's ``tree``."""
        probe_kernel = kernel or tree() / f"boot/vmlinuz-{image.release_of(tree())}"
        self.accel = "kvm" if machine.kvm_works(probe_kernel) else "tcg"
        self.say(f"[lab] accelerator: {self.accel}")
        self.machine = machine.LabMachine(
            self.work, img, kernel, initrd, APPEND if kernel else "", key, self.accel
        )
        self.machine.start()
        seconds = self.machine.wait_ssh(self.boot_wait)
        if not library:
            return seconds
        # the library and its template, on python3's path as an installed package would be
        # (its dependencies are Debian's python3-* packages in the image)
        self.machine.copy_to(REPO / "passthrough", SRC)
        self.machine.copy_to(REPO / "templates", SRC)
        r = self.sh(f"echo {SRC} > /usr/lib/python3/dist-packages/passthrough-lab.pth")
        if r.returncode != 0:
            raise LabFailed(f"installing the toolkit: {r.stderr.strip()}")
        return seconds

    def scan(self) -> dict[str, Any]:
        r = self.pt("scan --json")
        if r.returncode != 0:
            raise LabFailed(f"scan failed: {r.stderr.strip()}")
        data: dict[str, Any] = json.loads(r.stdout)
        gpus = {g["address"]: g for g in data["gpus"]}
        checks = {c["id"]: c["level"] for c in data["checks"]}
        problems = []
        if data["host"]["iommu"]["groups"] < 5:
            problems.append("too few IOMMU groups")
        if checks.get("interrupt-remapping") != "PASS" or checks.get("iommu-enabled") != "PASS":
            problems.append(f"checks: {checks}")
        card = gpus.get(CARD)
        if not card or not card["viable"] or card["functions"] != CARD_FUNCTIONS:
            problems.append(f"stand-in card: {card}")
        neg = gpus.get(NEGATIVE)
        if not neg or neg["viable"] or not any(NEGATIVE_PEER in r for r in neg["reasons"]):
            problems.append(f"negative case: {neg}")
        if problems:
            raise LabFailed("; ".join(problems))
        return data

    def bind(self) -> dict[str, str]:
        r = self.sh("modprobe vfio-pci")
        if r.returncode != 0:
            raise LabFailed(f"modprobe vfio-pci: {r.stderr.strip()}")
        r = self.pt(f"bind --yes --gpu {CARD} --json")
        if r.returncode != 0:
            raise LabFailed(f"bind: {r.stderr.strip()}")
        if json.loads(r.stdout)["bound"] != CARD_FUNCTIONS:
            raise LabFailed(f"bind reported {r.stdout}")
        before = self.drivers([NEGATIVE])[NEGATIVE]
        refused = self.pt(f"bind --yes --gpu {NEGATIVE}")
        if refused.returncode != 2 or NEGATIVE_PEER not in refused.stderr:
            raise LabFailed(
                f"negative case was not refused: rc={refused.returncode} {refused.stderr.strip()}"
            )
        drivers = self.drivers([*CARD_FUNCTIONS, NEGATIVE])
        if any(drivers[a] != "vfio-pci" for a in CARD_FUNCTIONS) or drivers[NEGATIVE] != before:
            raise LabFailed(f"drivers after bind: {drivers} (negative case was {before})")
        return drivers
