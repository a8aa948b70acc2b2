"""The lab, run from outside: a real Debian 12 kernel under QEMU with an emulated Intel
IOMMU, and the toolkit inside it.

    python lab/run.py [--keep WORKDIR]

Stages (each prints what it does and how long it took):
  image   debootstrap once (cached, rebuilt when the recipe changes), then an ext4 image
  boot    QEMU q35 + intel-iommu (intremap, caching-mode), TCG, SSH port forward
  scan    `passthrough scan/check --json` on the real kernel: IOMMU groups, interrupt
          remapping, the two-function stand-in card viable, the stand-in display that shares
          its group with a NIC refused
  bind    `passthrough bind` moves both functions of the card to vfio-pci, confirmed by the
          kernel's bind events through pyudev; the negative case is refused and left alone
On failure the console log and every command's output stay in the artifacts directory
(PASSTHROUGH_LAB_ARTIFACTS, default ./lab-artifacts).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import image
import machine

REPO = Path(__file__).resolve().parents[1]
CARD = "0000:01:00.0"
CARD_FUNCTIONS = ["0000:01:00.0", "0000:01:00.1"]
NEGATIVE = "0000:02:01.0"
NEGATIVE_PEER = "0000:02:02.0"
APPEND = "root=/dev/vda rw console=ttyS0 intel_iommu=on iommu=pt"


class LabFailed(Exception):
    pass


class Lab:
    def __init__(self, work: Path, artifacts: Path, say: Callable[[str], None] = print) -> None:
        self.work = work
        self.artifacts = artifacts
        self.say = say
        self.timings: dict[str, float] = {}
        self.machine: machine.LabMachine | None = None
        self.log: list[str] = []

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
        return self.sh(f"cd /opt/passthrough-src && python3 -m passthrough {args}")

    # -- stages -------------------------------------------------------------------------
    def _key(self) -> Path:
        """The SSH key root logs into the lab with (made once per work directory)."""
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

    def boot(self, img: Path, kernel: Path | None, initrd: Path | None, key: Path) -> float:
        """Start the machine (direct kernel boot, or UEFI + GRUB from the disk when no kernel
        is given), wait for sshd, and put the toolkit inside."""
        self.machine = machine.LabMachine(
            self.work, img, kernel, initrd, APPEND if kernel else "", key
        )
        self.machine.start()
        seconds = self.machine.wait_ssh()
        import pyudev

        self.machine.copy_to(REPO / "passthrough", "/opt/passthrough-src")
        self.machine.copy_to(Path(pyudev.__file__).parent, "/opt/passthrough-src")  # pure Python
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
        r = self.pt(f"bind --gpu {CARD} --json")
        if r.returncode != 0:
            raise LabFailed(f"bind: {r.stderr.strip()}")
        if json.loads(r.stdout)["bound"] != CARD_FUNCTIONS:
            raise LabFailed(f"bind reported {r.stdout}")
        before = self.sh(
            f"basename $(readlink /sys/bus/pci/devices/{NEGATIVE}/driver)"
        ).stdout.strip()
        refused = self.pt(f"bind --gpu {NEGATIVE}")
        if refused.returncode != 2 or NEGATIVE_PEER not in refused.stderr:
            raise LabFailed(
                f"negative case was not refused: rc={refused.returncode} {refused.stderr.strip()}"
            )
        drivers = {}
        for addr in [*CARD_FUNCTIONS, NEGATIVE]:
            drivers[addr] = self.sh(
                f"basename $(readlink /sys/bus/pci/devices/{addr}/driver)"
            ).stdout.strip()
        if any(drivers[a] != "vfio-pci" for a in CARD_FUNCTIONS) or drivers[NEGATIVE] != before:
            raise LabFailed(f"drivers after bind: {drivers} (negative case was {before})")
        return drivers

    # -- the full chain: UEFI + GRUB from the disk, apply, reboot, verify, undo, reboot ---------
    FILES = "find /etc /boot -xdev -type f ! -path '/etc/ssh/*' ! -path '/etc/machine-id' -print0 | sort -z | xargs -0 sha256sum"

    def apply(self) -> dict[str, Any]:
        cmdline = self.sh("cat /proc/cmdline").stdout
        if "iommu=pt" in cmdline:
            raise LabFailed(f"the first boot already has iommu=pt: {cmdline}")
        self.baseline = self.sh(self.FILES).stdout
        r = self.pt(f"apply --gpu {CARD} --json")
        if r.returncode != 0:
            raise LabFailed(f"apply: {r.stderr.strip()[-800:]}")
        result: dict[str, Any] = json.loads(r.stdout)
        ran = [s for s in result["steps"] if s["kind"] == "run"]
        if not ran or any(s["state"] != "done" for s in ran):
            raise LabFailed(f"regeneration commands did not run: {ran}")
        # Debian's kernel has the Intel IOMMU on by default: the plan adds iommu=pt, and binds
        # the card per device (other devices share its display function's IDs)
        grub = self.sh("grep -c 'iommu=pt' /boot/grub/grub.cfg").stdout.strip()
        if grub in ("", "0"):
            raise LabFailed("update-grub did not put iommu=pt into /boot/grub/grub.cfg")
        return result

    def reboot(self) -> float:
        assert self.machine is not None
        return self.machine.reboot()

    def verify(self) -> dict[str, Any]:
        r = self.pt("verify --json")
        data: dict[str, Any] = json.loads(r.stdout) if r.stdout.strip() else {}
        if r.returncode != 0 or not data.get("ok"):
            raise LabFailed(
                f"verify after the reboot: {r.stdout.strip()[-1500:]} {r.stderr.strip()[-500:]}"
            )
        neg = self.sh(f"basename $(readlink /sys/bus/pci/devices/{NEGATIVE}/driver)").stdout.strip()
        if neg == "vfio-pci":
            raise LabFailed("the refused stand-in display was taken by vfio-pci")
        refused = self.pt(f"plan --gpu {NEGATIVE}")
        if refused.returncode != 2 or NEGATIVE_PEER not in refused.stderr:
            raise LabFailed(f"the negative case was not refused: {refused.stderr.strip()}")
        return data

    def undo(self) -> None:
        r = self.pt("undo --json")
        if r.returncode != 0:
            raise LabFailed(f"undo: {r.stderr.strip()}")
        now = self.sh(self.FILES).stdout
        if now != self.baseline:
            before = dict(line.split("  ", 1)[::-1] for line in self.baseline.splitlines())
            after = dict(line.split("  ", 1)[::-1] for line in now.splitlines())
            differ = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            differ = [d for d in differ if not d.startswith("/var/lib/passthrough")]
            if differ:
                raise LabFailed(f"undo left files changed: {differ[:10]}")

    def back(self) -> dict[str, str]:
        cmdline = self.sh("cat /proc/cmdline").stdout
        if "iommu=pt" in cmdline or "vfio" in cmdline:
            raise LabFailed(
                f"after undo and reboot the command line still has our arguments: {cmdline}"
            )
        drivers = {
            a: self.sh(
                f"basename $(readlink /sys/bus/pci/devices/{a}/driver 2>/dev/null) 2>/dev/null"
            ).stdout.strip()
            for a in CARD_FUNCTIONS
        }
        if any(d == "vfio-pci" for d in drivers.values()):
            raise LabFailed(f"after undo and reboot: {drivers}")
        return drivers

    def _guarded(self, stages: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Run the stages; keep the artifacts on failure; stop the machine in any case."""
        try:
            return stages()
        except Exception:
            self.keep_artifacts()
            raise
        finally:
            if self.machine is not None:
                self.machine.stop()

    def run_full(self) -> dict[str, Any]:
        def stages() -> dict[str, Any]:
            def build() -> tuple[Path, Path]:
                key = self._key()
                return image.disk(self.work, (self.work / "id_lab.pub").read_text()), key

            disk, key = self.stage("image", build)
            self.stage("boot (UEFI, GRUB from disk)", lambda: self.boot(disk, None, None, key))
            self.stage("apply (real update-initramfs, update-grub)", self.apply)
            self.stage("reboot", self.reboot)
            self.stage("verify", self.verify)
            self.stage("undo", self.undo)
            self.stage("reboot after undo", self.reboot)
            drivers = self.stage("back to the original", self.back)
            return {"ok": True, "timings": self.timings, "drivers_after_undo": drivers}

        return self._guarded(stages)

    def run(self) -> dict[str, Any]:
        def stages() -> dict[str, Any]:
            img, kernel, initrd, key = self.stage("image", self.build)
            self.stage("boot", lambda: self.boot(img, kernel, initrd, key))
            scan = self.stage("scan", self.scan)
            drivers = self.stage("bind", self.bind)
            return {
                "ok": True,
                "timings": self.timings,
                "groups": scan["host"]["iommu"]["groups"],
                "drivers": drivers,
            }

        return self._guarded(stages)

    def keep_artifacts(self) -> None:
        self.artifacts.mkdir(parents=True, exist_ok=True)
        console = self.work / "console.log"
        if console.exists():
            shutil.copy(console, self.artifacts / "console.log")
        (self.artifacts / "commands.log").write_text("\n".join(self.log))
        self.say(f"[lab] artifacts kept in {self.artifacts}")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--keep", metavar="WORKDIR", help="work here and keep it (default: a temporary directory)"
    )
    ap.add_argument("--artifacts", default="lab-artifacts")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--full",
        action="store_true",
        help="the whole chain: UEFI boot, apply, reboot, verify, undo, reboot",
    )
    args = ap.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="passthrough-lab-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        lab = Lab(work, Path(args.artifacts), say=(lambda m: print(m, file=sys.stderr)))
        result = lab.run_full() if args.full else lab.run()
    except (LabFailed, RuntimeError, TimeoutError) as exc:
        print(f"lab: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        total = sum(result["timings"].values())
        print(
            "lab: passed — "
            + ", ".join(f"{k} {v:.1f}s" for k, v in result["timings"].items())
            + f", total {total:.1f}s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
