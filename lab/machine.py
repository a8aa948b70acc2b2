# SPDX-License-Identifier: Apache-2.0
"""A lab machine: QEMU q35 with an emulated Intel IOMMU (interrupt remapping and caching
mode, so vfio-pci works inside), TCG, user networking with an SSH port forward, and GPU
stand-ins on the PCI bus. Waits on real events (the SSH banner), never on sleeps alone."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import tempfile
import time
from pathlib import Path

# A two-function "card" behind its own PCIe root port: a display and a USB controller of
# one vendor on one slot (QEMU's qxl and qemu-xhci, both Red Hat 1b36 — a card's companion
# functions share its vendor, as the USB-C controller of a Turing card does); and a second
# display that shares its IOMMU group with a NIC behind a PCIe-to-PCI bridge (no ACS
# there): the negative case, a second qxl, so the card's display ID is shared and the plan
# binds per device (driver_override, what the full chain's break edits) rather than by
# vfio-pci.ids. The stand-ins have no NVIDIA IDs; tests select by address.
STAND_INS = [
    "-device",
    "pcie-root-port,id=rp1,chassis=1,slot=1,bus=pcie.0,addr=0x5",
    "-device",
    "qxl,bus=rp1,addr=0x0.0x0,multifunction=on",
    "-device",
    "qemu-xhci,bus=rp1,addr=0x0.0x1",
    "-device",
    "pcie-pci-bridge,id=pb1,bus=pcie.0,addr=0x6",
    "-device",
    "qxl,bus=pb1,addr=0x1",
    "-device",
    "e1000,bus=pb1,addr=0x2,netdev=n1",
    "-netdev",
    "user,id=n1,restrict=on",
]
BIG_BAR_GIB = 64  # ivshmem-plain's BAR2: a power of two, above OVMF's 32 GiB fallback window
# The lab host's own 64-bit window, set rather than left to OVMF's guess from TCG's 40 bits:
# 128 GiB holds the big BAR (SeaBIOS, in stage one, places it by itself).
LAB_WINDOW_MIB = 128 * 1024


def big_bar(work: Path) -> list[str]:
    """The large-BAR stand-in: QEMU's ivshmem-plain, whose BAR2 (64-bit prefetchable) is a
    shared memory backend — a sparse file, so 64 GiB costs no RAM or disk — behind its own
    root port (its own IOMMU group). QEMU's display devices keep their VRAM in anonymous
    RAM, which Linux refuses to overcommit beyond the machine's memory."""
    return [
        "-object",
        f"memory-backend-file,id=bigbar,size={BIG_BAR_GIB}G,mem-path={work / 'bigbar.mem'},"
        "share=on",
        "-device",
        "pcie-root-port,id=rp2,chassis=2,slot=2,bus=pcie.0,addr=0x7",
        "-device",
        "ivshmem-plain,memdev=bigbar,bus=rp2,addr=0x0",
        "-fw_cfg",
        f"name=opt/ovmf/X-PciMmio64Mb,string={LAB_WINDOW_MIB}",
        "-global",
        f"q35-pcihost.pci-hole64-size={LAB_WINDOW_MIB}M",
    ]


def kvm_works(kernel: Path, timeout: float = 30) -> bool:
    """Whether ``-accel kvm`` really runs a guest on this machine. ``/dev/kvm`` can exist and
    still fail (seen: QEMU aborting on an MSR the host refuses, or a guest hanging at boot),
    so the probe boots ``kernel`` with no root filesystem and waits for its panic on the
    serial port: a kernel that got that far ran under KVM. PASSTHROUGH_LAB_KVM=0/1 decides
    without probing."""
    forced = os.environ.get("PASSTHROUGH_LAB_KVM")
    if forced in ("0", "1"):
        return forced == "1"
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    with tempfile.TemporaryDirectory(prefix="kvm-probe-") as tmp:
        log = Path(tmp) / "serial.log"
        argv = [
            "qemu-system-x86_64",
            "-accel",
            "kvm",
            "-M",
            "q35",
            "-cpu",
            "max",
            "-m",
            "256",
            "-kernel",
            str(kernel),
            "-append",
            "console=ttyS0 panic=-1",
            "-no-reboot",
            "-display",
            "none",
            "-monitor",
            "none",
            "-serial",
            f"file:{log}",
        ]
        # a hang ends at the timeout; the panic may still have been printed
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(argv, capture_output=True, timeout=timeout, check=False)
        return log.exists() and b"Kernel panic" in log.read_bytes()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LabMachine:
    def __init__(
        self,
        work: Path,
        image: Path,
        kernel: Path | None,
        initrd: Path | None,
        append: str,
        key: Path,
        accel: str = "tcg",
    ) -> None:
        self.accel = accel
        self.work = work
        self.image = image
        self.kernel = kernel
        self.initrd = initrd
        self.append = append
        self.key = key
        self.port = free_port()
        self.console = work / "console.log"
        self.stderr = work / "qemu-stderr.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [
            "qemu-system-x86_64",
            "-accel",
            self.accel,
            "-M",
            "q35,kernel-irqchip=split",
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "3072",  # the lab host's own guest pins its memory (vfio)
            "-device",
            "intel-iommu,intremap=on,caching-mode=on",
            *self.boot_args(),
            "-drive",
            f"file={self.image},if=virtio,format=raw",
            "-netdev",
            f"user,id=n0,hostfwd=tcp:127.0.0.1:{self.port}-:22",
            "-device",
            "virtio-net-pci,netdev=n0,bus=pcie.0,addr=0x3",
            *STAND_INS,
            *big_bar(self.work),
            "-display",
            "none",
            "-serial",
            f"file:{self.console}",
            "-monitor",
            "none",
        ]

    def boot_args(self) -> list[str]:
        if self.kernel is not None:
            # no initrd: a kernel with its root's drivers built in (lab/modern.py)
            initrd = ["-initrd", str(self.initrd)] if self.initrd is not None else []
            return ["-kernel", str(self.kernel), *initrd, "-append", self.append]
        # UEFI: OVMF reads the ESP, GRUB reads /boot/grub/grub.cfg from the disk
        vars_copy = self.work / "OVMF_VARS.fd"
        if not vars_copy.exists():
            vars_copy.write_bytes(Path("/usr/share/OVMF/OVMF_VARS_4M.fd").read_bytes())
        return [
            "-drive",
            "if=pflash,format=raw,readonly=on,file=/usr/share/OVMF/OVMF_CODE_4M.fd",
            "-drive",
            f"if=pflash,format=raw,file={vars_copy}",
        ]

    def reboot(self, timeout: float = 900) -> float:
        """Reboot from inside (as a user would) and wait for SSH to come back."""
        assert self.proc is not None
        self.ssh("systemctl reboot", timeout=30)
        # the old sshd must go away before the new one is waited for
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    ready, _, _ = select.select([s], [], [], 3)
                    if not ready or not s.recv(4).startswith(b"SSH-"):
                        break
            except OSError:
                break
            time.sleep(1)
        return self.wait_ssh(timeout)

    def start(self) -> None:
        with open(self.stderr, "ab") as err:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
            )

    def wait_ssh(self, timeout: float = 600) -> float:
        """Seconds until sshd answered with its banner."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"QEMU exited: {self.exit_status()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
                    ready, _, _ = select.select([s], [], [], 10)
                    if ready and s.recv(4).startswith(b"SSH-"):
                        return time.monotonic() - started
            except OSError:
                pass
            time.sleep(1)  # the forwarded port answers before the guest does: retry
        raise TimeoutError(f"no SSH banner within {timeout:.0f}s (console: {self.console})")

    def ssh_argv(self) -> list[str]:
        return [
            "ssh",
            "-i",
            str(self.key),
            "-p",
            str(self.port),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
            "root@127.0.0.1",
        ]

    def ssh(self, command: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.ssh_argv(), command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def copy_to(self, local: Path, remote: str) -> None:
        tarball = subprocess.run(
            # -h: the links in the tree (passthrough/guest into the collection) as the files
            ["tar", "-h", "-C", str(local.parent), "-czf", "-", local.name],
            capture_output=True,
            check=True,
        ).stdout
        r = subprocess.run(
            [*self.ssh_argv(), f"mkdir -p {remote} && tar -C {remote} -xzf -"],
            input=tarball,
            capture_output=True,
            check=False,
        )
        if r.returncode != 0:
            raise RuntimeError(f"copy to the lab failed: {r.stderr.decode().strip()}")

    def exit_status(self) -> str | None:
        """None while QEMU runs; once it has exited, its exit code and last words."""
        if self.proc is None or self.proc.poll() is None:
            return None
        err = self.stderr.read_text(errors="replace").strip() if self.stderr.exists() else ""
        return f"exit code {self.proc.returncode}: {err[-500:]}"

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
