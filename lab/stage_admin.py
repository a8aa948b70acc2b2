# SPDX-License-Identifier: Apache-2.0
"""The admin's own edit after apply: one more argument on GRUB_CMDLINE_LINUX_DEFAULT with
sed, update-grub, and after a reboot /proc/cmdline with the admin's argument and ours,
theirs first."""

from __future__ import annotations

from typing import Any

from labcore import ADMIN_ARG, ADMIN_GRUB, LabCore, LabFailed, _sha256, with_admin_edit


class AdminStages(LabCore):
    """admin_edit, then (after the break's reboot) admin_cmdline."""

    def admin_edit(self) -> dict[str, Any]:
        """The admin, after apply, edits /etc/default/grub as they always have (one more
        argument on GRUB_CMDLINE_LINUX_DEFAULT, with sed) and runs update-grub. Our drop-in
        appends to the value the admin sets, so grub.cfg must carry both; the break's reboot
        boots it (`admin_cmdline` reads /proc/cmdline after it)."""
        dropin = "/etc/default/grub.d/99-passthrough.cfg"
        # our arguments: the drop-in sourced on an empty value, as grub-mkconfig sources it
        ours = self.sh(
            f"env -i bash -c 'GRUB_CMDLINE_LINUX_DEFAULT=; . {dropin}; "
            'printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"\''
        )
        self.ours = ours.stdout.split()
        if ours.returncode != 0 or "iommu=pt" not in self.ours:
            raise LabFailed(f"our drop-in does not append iommu=pt: {ours.stdout!r} {ours.stderr}")
        text = self.sh(f"cat {ADMIN_GRUB}").stdout
        if f"{_sha256(text)}  {ADMIN_GRUB}" not in self.baseline.splitlines():
            raise LabFailed(f"{ADMIN_GRUB} changed between the baseline and the admin's edit")
        self.admin_grub = _sha256(with_admin_edit(text))
        linux = self.admin_sed("update-grub")
        return {"ours": self.ours, "grub_cfg": " ".join(linux)}

    def admin_sed(self, regenerate: str) -> list[str]:
        """The admin's sed on /etc/default/grub as it is now (one more argument on
        GRUB_CMDLINE_LINUX_DEFAULT; the file must then be ``with_admin_edit`` of it), then
        ``regenerate``; the default entry's linux line, which must carry the admin's argument
        and ours."""
        want = _sha256(with_admin_edit(self.sh(f"cat {ADMIN_GRUB}").stdout))
        r = self.sh(
            f'sed -i \'s/^\\(GRUB_CMDLINE_LINUX_DEFAULT="[^"]*\\)"$/\\1 {ADMIN_ARG}"/\' '
            f"{ADMIN_GRUB} && sha256sum {ADMIN_GRUB} && {regenerate}"
        )
        if r.returncode != 0 or not r.stdout.startswith(want):
            raise LabFailed(f"the admin's edit: {r.stdout.strip()[:200]} {r.stderr[-500:]}")
        linux = self.default_linux()
        if ADMIN_ARG not in linux or not set(self.ours) <= set(linux):
            raise LabFailed(f"{regenerate} did not put the admin's argument and ours: {linux}")
        return linux

    def default_linux(self) -> list[str]:
        """The words of the default GRUB entry's linux line in /boot/grub/grub.cfg: the first
        one (GRUB_DEFAULT=0; recovery entries take GRUB_CMDLINE_LINUX only)."""
        cfg = self.sh("cat /boot/grub/grub.cfg").stdout.splitlines()
        linux = next((ln.split() for ln in cfg if ln.split()[:1] == ["linux"]), None)
        if linux is None:
            raise LabFailed("/boot/grub/grub.cfg has no linux line")
        return linux

    def admin_cmdline(self) -> dict[str, Any]:
        """After the break's reboot: the admin's argument and ours, theirs first (our drop-in
        appends to their value)."""
        cmdline = self.sh("cat /proc/cmdline").stdout.strip()
        words = cmdline.split()
        admin = ADMIN_ARG in words
        ours = bool(self.ours) and all(a in words for a in self.ours)
        if not (admin and ours):
            raise LabFailed(
                f"after the admin's edit and a reboot /proc/cmdline lacks "
                f"{'the admin argument' if not admin else 'ours ' + str(self.ours)}: {cmdline}"
            )
        if words.index(ADMIN_ARG) > min(words.index(a) for a in self.ours):
            raise LabFailed(f"our arguments come before the admin's: {cmdline}")
        return {"cmdline": cmdline, "admin": admin, "ours": ours, "args": self.ours}
