# SPDX-License-Identifier: Apache-2.0
"""The lab, run from outside: a real Debian 12 kernel under QEMU with an emulated Intel
IOMMU, and the toolkit inside it.

    python lab/run.py [--full] [--keep WORKDIR]

Stage one (each stage prints what it does and how long it took):
  image   debootstrap once (cached, rebuilt when the recipe changes), then an ext4 image
  boot    QEMU q35 + intel-iommu (intremap, caching-mode), SSH port forward; KVM only when a
          probe shows it works here, TCG otherwise
  scan    `passthrough scan/check --json` on the real kernel: IOMMU groups, interrupt
          remapping, the two-function stand-in card viable, the stand-in display that shares
          its group with a NIC refused
  bind    `passthrough bind` moves both functions of the card to vfio-pci, confirmed by the
          kernel's bind events through pyudev; the negative case is refused and left alone

--full, the whole chain on a disk that boots through OVMF and GRUB:
  provision  the lab host has no passthrough library (stage one copies it onto python3's
             path; the full chain does not); `passthrough provision --playbook host.yml`
             over SSH as the user `lab`, root through sudo (become): the collection
             installs the controller's wheel into /opt/passthrough/venv, then checks,
             plan, apply (real update-initramfs and update-grub inside), the reboot
             through Ansible, verify; then the same play again, which must report 0
             changed, not reboot, and leave the venv as it was
  verify     /proc/cmdline, `passthrough verify`, both functions on vfio-pci, the negative
             case untouched and refused
  guest      `passthrough provision --playbook vm.yml`: the lab host's own libvirt renders,
             validates, defines and starts a guest with the card; its live XML and QEMU's PCI
             list show both functions; the playbook then removes it
  nested     a guest that boots: the library renders the card and the 64 GiB-BAR stand-in
             with the address planner's layout; the lab host's kernel and a busybox
             initramfs boot through OVMF inside it (TCG inside TCG) and print the guest's
             PCI view; every BAR at full size at the promised addresses, the big one in the
             planned window — and without the planner's window and bits, the kernel must
             report that BAR unassigned (lab/nested.py, lab/nested_render.py); with
             --no-nested-break (CI's lab tier) only the planned boot: the unplanned one is
             tests/lab/test_firmware_window.py's check, made there without the lab host
  admin      the admin edits /etc/default/grub after apply (one more kernel argument) and
             runs update-grub; the break's reboot boots it, and /proc/cmdline must have the
             admin's argument and ours
  break      the companion function's override is taken out of the applied udev rule; after a
             reboot `passthrough verify` must fail and name that function
  undo       `passthrough undo`, a reboot: the original files (the admin's /etc/default/grub
             with their edit), arguments (the admin's kept, ours gone) and drivers
On failure the console log, the Ansible logs and every command's output stay in the
artifacts directory (PASSTHROUGH_LAB_ARTIFACTS, default ./lab-artifacts).

Each stage is a module of its own, read alone: labcore.py (the facts and the machine every
stage uses), stage_one.py (image, boot, scan, bind), stage_fleet.py (provision, verify,
guest), stage_nested.py (nested), stage_admin.py (admin), stage_undo.py (break, undo);
this file puts them in order.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import image
from labcore import LabFailed
from stage_admin import AdminStages
from stage_fleet import FleetStages
from stage_nested import NestedStages
from stage_one import StageOne
from stage_undo import UndoStages


class Lab(StageOne, FleetStages, NestedStages, AdminStages, UndoStages):
    """The lab: stage one (``run``) or the whole chain (``run_full``), each stage timed."""

    def run_full(self, nested_break: bool = True) -> dict[str, Any]:
        """The whole chain; without ``nested_break`` the nested guest boots once, with the
        planner's layout (tests/lab/test_firmware_window.py boots the same kernel without it
        through OVMF, in seconds: CI's lab tier leaves the break here out)."""

        def stages() -> dict[str, Any]:
            def build() -> tuple[Path, Path]:
                key = self._key()
                return image.disk(self.work, (self.work / "id_lab.pub").read_text()), key

            disk, key = self.stage("image", build)
            self.stage(
                "boot (UEFI, GRUB from disk)",
                lambda: self.boot(disk, None, None, key, library=False),
            )
            host = self.stage(
                "provision host.yml (apply, Ansible reboot, verify)", self.provision_host
            )
            again = self.stage("provision host.yml again: 0 changed", self.provision_again)
            self.stage("verify", self.verify)
            guest = self.stage("guest under the lab host's libvirt (vm.yml)", self.guest)
            rendered = self.stage(
                "nested guest: initramfs, render with the planner", self.nested_prepare
            )
            planned = self.stage(
                "nested guest boots (planned layout), its view read",
                lambda: self.nested_alone(self.nested_planned, rendered),
            )
            unplanned = (
                self.stage(
                    "nested break: no window, 38 bits, BAR unassigned",
                    lambda: self.nested_alone(self.nested_break, rendered),
                )
                if nested_break
                else None
            )
            edit = self.stage(
                "admin edits /etc/default/grub after apply, update-grub", self.admin_edit
            )
            broken = self.stage(
                "break: companion override removed, reboot, verify fails", self.sabotage
            )
            admin = self.stage("admin's argument and ours in /proc/cmdline", self.admin_cmdline)
            self.stage("undo", self.undo)
            self.stage("reboot after undo", self.reboot)
            back = self.stage("back to the original", self.back)
            return {
                "ok": True,
                "accel": self.accel,
                "timings": self.timings,
                "provision_seconds": host["seconds"],
                "bare_host": host["bare"],
                "runtime": host["runtime"],
                "ansible_user": image.USER,
                "host_again": again,
                "guest": guest,
                "nested": planned,
                "nested_break": unplanned,
                "break": broken,
                "admin_edit": {
                    **admin,
                    "grub_cfg": edit["grub_cfg"],
                    "cmdline_after_undo": back["cmdline"],
                },
                "drivers_after_undo": back["drivers"],
            }

        return self._guarded(stages)

    def run(self) -> dict[str, Any]:
        def stages() -> dict[str, Any]:
            img, kernel, initrd, key = self.stage("image", self.build)
            self.stage("boot", lambda: self.boot(img, kernel, initrd, key))
            scan = self.stage("scan", self.scan)
            drivers = self.stage("bind", self.bind)
            return {
                "ok": True,
                "accel": self.accel,
                "timings": self.timings,
                "groups": scan["host"]["iommu"]["groups"],
                "drivers": drivers,
            }

        return self._guarded(stages)


def parser(description: str | None) -> argparse.ArgumentParser:
    """The options every lab script takes."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--keep", metavar="WORKDIR", help="work here and keep it (default: a temporary directory)"
    )
    ap.add_argument("--artifacts", default="lab-artifacts")
    ap.add_argument("--json", action="store_true")
    return ap


def lab_main(
    args: argparse.Namespace,
    name: str,
    run: Callable[[Path, Path, Callable[[str], None]], dict[str, Any]],
) -> int:
    """Run ``run(work, artifacts, say)`` in the work directory and report: its result as
    JSON, or one line with each stage's time."""
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="passthrough-lab-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        result = run(work, Path(args.artifacts), lambda m: print(m, file=sys.stderr))
    except (LabFailed, RuntimeError, TimeoutError) as exc:
        print(f"{name}: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        total = sum(result["timings"].values())
        print(
            f"{name}: passed — "
            + ", ".join(f"{k} {v:.1f}s" for k, v in result["timings"].items())
            + f", total {total:.1f}s"
        )
    return 0


def main() -> int:
    ap = parser(__doc__)
    ap.add_argument(
        "--full",
        action="store_true",
        help="the whole chain: UEFI boot, provision (apply, reboot, verify), a guest, a "
        "deliberate break, undo, reboot",
    )
    ap.add_argument(
        "--no-nested-break",
        action="store_true",
        help="with --full: leave out the nested guest's second boot without the planner's "
        "layout (tests/lab/test_firmware_window.py makes that check without the lab host; "
        "CI's lab tier passes this)",
    )
    args = ap.parse_args()

    def run(work: Path, artifacts: Path, say: Callable[[str], None]) -> dict[str, Any]:
        lab = Lab(work, artifacts, say=say)
        return lab.run_full(not args.no_nested_break) if args.full else lab.run()

    return lab_main(args, "lab", run)


if __name__ == "__main__":
    raise SystemExit(main())
