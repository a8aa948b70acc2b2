# SPDX-License-Identifier: Apache-2.0
"""NixOS: /etc and the boot entries are generated from configuration.nix, so nothing of
ours can be written there (the next ``nixos-rebuild`` would take it away, and until then
it is read by nothing). The plan is refused with the exact lines to add instead."""

from __future__ import annotations

from passthrough.errors import PassthroughError
from passthrough.kargs import ArgChange

INITRD_MODULES = ("vfio_pci", "vfio", "vfio_iommu_type1")


def _nix_string(value: str) -> str:
    """A Nix double-quoted string: \\, " and the start of an interpolation escaped."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("${", "\\${") + '"'


def configuration_lines(target: ArgChange, removed: list[str], modprobe: str) -> list[str]:
    """What configuration.nix needs for this plan: kernel parameters, the vfio modules in
    the initrd, and the modprobe options and softdeps our plan would write."""
    params = " ".join(_nix_string(a) for a in target.set.values())
    modules = " ".join(_nix_string(m) for m in INITRD_MODULES)
    lines = [f"boot.kernelParams = [ {params} ];", f"boot.initrd.kernelModules = [ {modules} ];"]
    body = [ln for ln in modprobe.splitlines() if ln.strip() and not ln.startswith("#")]
    if body:
        # an indented string: '' and ${ are the only sequences it interprets
        safe = [ln.replace("''", "'''").replace("${", "''${") for ln in body]
        lines += ["boot.extraModprobeConfig = ''", *(f"  {ln}" for ln in safe), "'';"]
    if removed:
        lines.append(f"# and take out of boot.kernelParams: {' '.join(removed)}")
    return lines


class NixosRefused(PassthroughError):
    """Exit 2 (a refusal: nothing was changed), with what to put in configuration.nix."""

    def __init__(self, lines: list[str]) -> None:
        text = "\n".join(f"  {ln}" for ln in lines)
        super().__init__(
            "NixOS generates /etc and its boot entries from configuration.nix, so nothing "
            "was written: add these lines to /etc/nixos/configuration.nix, then run "
            f"`nixos-rebuild boot` and reboot:\n{text}"
        )
