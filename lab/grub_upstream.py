# SPDX-License-Identifier: Apache-2.0
"""The lab host with upstream GRUB: its grub-mkconfig reads /etc/default/grub only, as on
Arch, Gentoo and every distribution without Debian's grub.d patch.

    python lab/grub_upstream.py [--keep WORKDIR] [--artifacts DIR] [--json]

Upstream's script is made at test time from the image's own Debian one by taking out the
loop over /etc/default/grub.d/*.cfg (``upstream_mkconfig``, the same function
tests/test_boot_families.py makes its upstream script with), in the image's private copy,
never on this machine; update-grub, Debian's wrapper, goes too, so the host regenerates with
``grub-mkconfig -o /boot/grub/grub.cfg`` as upstream documents. The stages, each timed:
  image    the lab's cached tree → a GPT disk that boots through OVMF and GRUB (lab/run.py's
           full chain's disk), with upstream's grub-mkconfig
  boot     UEFI boot, SSH as root, the toolkit copied in
  first    discovery reads the script: GRUB, no grub.d; the baseline of /etc and /boot
  plan     `plan --iommu-only`: our arguments go into /etc/default/grub (a marked appending
           line), nothing into grub.d; grub-mkconfig regenerates
  apply    `apply --iommu-only --yes` (kernel arguments only: no initramfs rebuild): the
           default entry of grub.cfg has our arguments
  admin    the admin adds an argument to /etc/default/grub with sed and runs grub-mkconfig
  reboot   /proc/cmdline has the admin's argument and ours, theirs first
  undo     `undo --yes`: /etc as before except /etc/default/grub, which is the original plus
           the admin's edit (by hash); grub.cfg without ours, with theirs
  clean    after a reboot: ours gone from /proc/cmdline, the admin's kept
On failure the console log and every command's output stay in the artifacts directory.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import image
from labcore import ADMIN_ARG, ADMIN_GRUB, LabFailed, _sha256, with_admin_edit
from run import Lab, lab_main, parser

# Debian's patch to grub-mkconfig: after sourcing /etc/default/grub, every grub.d/*.cfg
GRUB_D_LOOP = re.compile(
    r"^for x in \$\{sysconfdir\}/default/grub\.d/\*\.cfg ; do\n.*?^done\n", re.M | re.S
)
MKCONFIG = "usr/sbin/grub-mkconfig"
REGENERATE = ["grub-mkconfig", "-o", "/boot/grub/grub.cfg"]
# the line of ours before our appending line at the end of /etc/default/grub
# (passthrough.boot.grub.MARKER: the lab reads it from the file, the library is not imported)
# what discovery says of upstream's script (passthrough.host.boot.read_grub)
READS_ONLY = f"/{MKCONFIG} sources /etc/default/grub only (upstream GRUB: no grub.d)"
MARKER = "# passthrough: GPU passthrough kernel arguments"


def upstream_mkconfig(debian: str) -> str:
    """Debian's grub-mkconfig without its grub.d patch: upstream's reading of the
    configuration (/etc/default/grub only)."""
    text, n = GRUB_D_LOOP.subn("", debian)
    if n != 1:
        raise ValueError(f"Debian's grub.d loop found {n} times in grub-mkconfig, not once")
    return text


def upstream_tune(staging: Path) -> None:
    """The image copy's grub-mkconfig made upstream's, and no update-grub (an upstream GRUB
    has none); the initramfs as the lab's disk has it."""
    image.modules_dep(staging)
    script = staging / MKCONFIG
    script.write_text(upstream_mkconfig(script.read_text()))
    for name in ("update-grub", "update-grub2"):
        (staging / "usr/sbin" / name).unlink(missing_ok=True)


class UpstreamGrubLab(Lab):
    """apply, an admin's edit, a reboot, undo and a reboot on a host whose grub-mkconfig
    reads no grub.d, as root over SSH with the CLI itself."""

    def __init__(self, work: Path, artifacts: Path, say: Callable[[str], None] = print) -> None:
        super().__init__(work, artifacts, say)
        self.original = ""  # /etc/default/grub on the first boot

    def build(self) -> tuple[Path, Path]:  # type: ignore[override]
        key = self._key()
        return image.disk(
            self.work, (self.work / "id_lab.pub").read_text(), tune=upstream_tune
        ), key

    def first_boot(self) -> dict[str, Any]:
        """Discovery must read upstream's script: GRUB, grub.d not read."""
        cmdline = self.sh("cat /proc/cmdline").stdout.split()
        if "iommu=pt" in cmdline:
            raise LabFailed(f"the first boot already has iommu=pt: {cmdline}")
        script = self.sh(f"grep -c 'default/grub.d' /{MKCONFIG}; command -v update-grub")
        if script.stdout.split() != ["0"]:
            raise LabFailed(
                f"/{MKCONFIG} is not upstream's or update-grub is there: {script.stdout}"
            )
        self.baseline = self.sh(self.FILES).stdout
        self.original = self.sh(f"cat {ADMIN_GRUB}").stdout
        r = self.pt("scan --json")
        if r.returncode != 0:
            raise LabFailed(f"scan: {r.stderr.strip()[-800:]}")
        boot: dict[str, Any] = json.loads(r.stdout)["host"]["boot"]
        evidence = boot.get("bootloader_evidence", [])
        if boot.get("bootloader") != "grub" or READS_ONLY not in evidence:
            raise LabFailed(f"discovery did not read upstream GRUB: {boot}")
        return {"bootloader": boot["bootloader"], "evidence": evidence}

    def plan(self) -> dict[str, Any]:
        r = self.pt("plan --iommu-only --json")
        if r.returncode != 0:
            raise LabFailed(f"plan: rc={r.returncode} {r.stderr.strip()[-800:]}")
        plan: dict[str, Any] = json.loads(r.stdout)
        self.ours = list(plan["kernel_args"]["set"])
        writes = [a["path"] for a in plan["actions"] if a["kind"] == "write"]
        runs = [a["argv"] for a in plan["actions"] if a["kind"] == "run"]
        if (
            not self.ours
            or writes != [ADMIN_GRUB]
            or runs != [REGENERATE]
            or MARKER not in plan["actions"][0].get("diff", "")
        ):
            raise LabFailed(f"the plan is not ours in {ADMIN_GRUB} and {REGENERATE}: {r.stdout}")
        return {"args": self.ours, "writes": writes, "runs": runs}

    def apply(self) -> dict[str, Any]:
        r = self.pt("apply --iommu-only --yes --json")
        if r.returncode != 0:
            raise LabFailed(f"apply: rc={r.returncode} {r.stderr.strip()[-1500:]}")
        if self.sh("test -e /etc/default/grub.d/99-passthrough.cfg").returncode == 0:
            raise LabFailed("apply wrote a grub.d drop-in that upstream grub-mkconfig never reads")
        linux = self.default_linux()
        if not set(self.ours) <= set(linux):
            raise LabFailed(f"grub.cfg's default entry lacks ours {self.ours}: {linux}")
        return {"grub_cfg": " ".join(linux)}

    def admin(self) -> dict[str, Any]:
        """The admin's sed on the file that now ends with our lines, and grub-mkconfig: after
        undo the file must be the original with the admin's edit."""
        self.admin_grub = _sha256(with_admin_edit(self.original))
        return {"grub_cfg": " ".join(self.admin_sed(" ".join(REGENERATE)))}

    def undo(self) -> dict[str, Any]:  # type: ignore[override]
        r = self.pt("undo --yes --json")
        if r.returncode != 0:
            raise LabFailed(f"undo: rc={r.returncode} {r.stderr.strip()[-1500:]}")
        differ, after = self.changed_since_baseline()
        if after.get(ADMIN_GRUB) != self.admin_grub:
            raise LabFailed(
                f"{ADMIN_GRUB} after undo is not the original with the admin's edit: "
                + self.sh(f"cat {ADMIN_GRUB}").stdout
            )
        differ.remove(ADMIN_GRUB)
        if differ:
            raise LabFailed(f"undo left files changed: {differ[:10]}")
        linux = self.default_linux()
        if ADMIN_ARG not in linux or set(self.ours) & set(linux):
            raise LabFailed(f"undo's grub-mkconfig left grub.cfg's default entry as {linux}")
        return {
            "grub_cfg": " ".join(linux),
            "default_grub": after[ADMIN_GRUB],
            "original_with_admin_edit": self.admin_grub,
        }

    def clean(self) -> dict[str, Any]:
        back = self.back()
        left = set(self.ours) & set(back["cmdline"].split())
        if left:
            raise LabFailed(f"after undo and a reboot /proc/cmdline still has {left}")
        return {"cmdline": back["cmdline"]}

    def run(self) -> dict[str, Any]:
        def stages() -> dict[str, Any]:
            disk, key = self.stage("image (upstream grub-mkconfig)", self.build)
            self.stage("boot (UEFI, GRUB from disk)", lambda: self.boot(disk, None, None, key))
            first = self.stage("first boot: discovery, baseline", self.first_boot)
            plan = self.stage("plan --iommu-only", self.plan)
            applied = self.stage("apply --iommu-only", self.apply)
            edit = self.stage("admin edits /etc/default/grub, grub-mkconfig", self.admin)
            self.stage("reboot", self.reboot)
            both = self.stage("admin's argument and ours in /proc/cmdline", self.admin_cmdline)
            undone = self.stage("undo", self.undo)
            self.stage("reboot after undo", self.reboot)
            clean = self.stage("clean", self.clean)
            return {
                "ok": True,
                "accel": self.accel,
                "timings": self.timings,
                "first": first,
                "plan": plan,
                "apply": applied,
                "admin": {**edit, "cmdline": both["cmdline"]},
                "undo": undone,
                "clean": clean,
            }

        return self._guarded(stages)


def main() -> int:
    args = parser(__doc__).parse_args()
    return lab_main(
        args,
        "lab: upstream GRUB",
        lambda work, artifacts, say: UpstreamGrubLab(work, artifacts, say).run(),
    )


if __name__ == "__main__":
    raise SystemExit(main())
