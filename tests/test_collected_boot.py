# SPDX-License-Identifier: Apache-2.0
"""Boot configuration shapes of Fedora/RHEL, openSUSE, Pop!_OS, Proxmox on ZFS and NixOS
hosts, seen in published repositories, through plan → apply → an admin's edit → undo.

Nothing fetched is kept here: each case is a minimal configuration of our own that keeps
the shape that matters in what was seen (the lines, quoting, variables and options the
host's tool must read right), and names where it was seen (repository, path, commit) —
``FOUND``, also listed in docs/bootloaders.md.

- GRUB through ``grub2-mkconfig`` (openSUSE; RHEL/CentOS without BLS entries): the root's
  ``grub2-mkconfig`` is this machine's real one made upstream's (tests/test_boot_families.py),
  and the kernel line is what a real ``bash`` gets sourcing /etc/default/grub
  (tests/bootread.py), through tests/test_realworld_boot.py's ``exercise``.
- Proxmox: ``proxmox-boot-tool`` cannot exist here; what it reads is computed as its
  ``get_first_line`` does (the first line of /etc/kernel/cmdline, nothing else).
- grubby (Fedora/RHEL BLS) and kernelstub (Pop!_OS) cannot run here (Debian has neither).
  The files they read are read as they read them (tests/bootread.py) and the commands
  apply lists are applied to those files by **stand-ins** (``grubby_stand_in``,
  ``kernelstub_stand_in`` below: grubby-bls's ``--args``/``--remove-args`` on the
  entries, or on grubenv's ``kernelopts`` where an entry uses it; kernelstub's ``-a``/``-d``
  on ``user.kernel_options``). Then a second plan must be empty, an admin's change through
  the same tool must stay, undo's commands must take ours out, and undo must give our own
  files back byte for byte.
- NixOS: ``nixos-rebuild`` cannot run here; plan and apply must refuse (exit 2) with the
  configuration.nix lines and write nothing, whatever the host's own .nix files hold.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from passthrough.actions import Run
from passthrough.cli import main
from passthrough.errors import PassthroughError
from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.journal.apply import apply
from passthrough.journal.undo import undo
from passthrough.kargs import key_of
from passthrough.plan.build import PlanOptions, make_plan

from .bootread import bls_options, grubenv, kernelstub_options, proxmox_first_line
from .conftest import build_variant
from .test_boot_families import _script, upstream_text
from .test_realworld_boot import Cmdline, Grub, exercise, kept, ours_in_effect, planned, tree

OPTS = PlanOptions(gpus=("01:00.0",))
RELEASE = {"fedora-40": "6.10.11-200.fc40.x86_64", "rhel-9": "5.14.0-427.13.1.el9_4.x86_64"}
MACHINE = "3f1e2a7c5b104c358d1c1b0e4a9f4c35"


@dataclass(frozen=True)
class Found:
    """Where the shape was seen: a published file (never copied here)."""

    repo: str
    path: str
    commit: str


@dataclass(frozen=True)
class Case:
    family: str
    host: str  # grub2-rhel, grub2-suse, grubby-fedora, grubby-rhel, kernelstub, proxmox, nixos
    found: Found
    files: dict[str, str] = field(default_factory=dict)
    refusal: str = ""  # part of the one-line refusal, where refusing is right


CENTOS_STREAM = Found(
    "ElwesHonorato/Cert_Linux_RHCSA",
    "Classes/84-Bootloader-GRUB2.sh",
    "e32ce6d596989e32aa254e269c90e66ff04a0cf0",
)
# proxmox-boot-tool's kernel hook: it reads /etc/kernel/cmdline with get_first_line
PBT_HOOK = Found(
    "jiangcuo/proxmox-kernel-helper",
    "src/proxmox-boot/zz-proxmox-boot",
    "002b7b17a46f13f6008f9cbf30ea23cfc1491afd",
)
# RHEL 8 entries that take their arguments from grubenv's kernelopts
KERNELOPTS = Found(
    "ComplianceAsCode/content",
    "shared/templates/grub2_bootloader_argument/tests/arg_not_in_grubenv_but_referenced.fail.sh",
    "a9fd9d6bb55fabc518687ac2bd9e1eeac714f090",
)
RH_DISTRIBUTOR = "GRUB_DISTRIBUTOR=\"$(sed 's, release .*$,,g' /etc/system-release)\"\n"
RH_BLS_GRUB = (
    "GRUB_TIMEOUT=5\n" + RH_DISTRIBUTOR + "GRUB_DEFAULT=saved\nGRUB_DISABLE_SUBMENU=true\n"
    'GRUB_CMDLINE_LINUX="crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M '
    'resume=/dev/mapper/cs-swap rd.lvm.lv=cs/root rhgb quiet"\n'
    'GRUB_DISABLE_RECOVERY="true"\nGRUB_ENABLE_BLSCFG=true\n'
)


def _entry(release: str, options: str) -> str:
    return (
        f"title Linux ({release})\nversion {release}\nlinux /vmlinuz-{release}\n"
        f"initrd /initramfs-{release}.img\noptions {options}\n"
        "grub_users $grub_users\ngrub_arg --unrestricted\ngrub_class kernel\n"
    )


def _entries(distro: str, options: str) -> dict[str, str]:
    release = RELEASE[distro]
    return {f"boot/loader/entries/{MACHINE}-{release}.conf": _entry(release, options)}


def _grubenv(**values: str) -> str:
    body = "# GRUB Environment Block\n" + "".join(f"{k}={v}\n" for k, v in values.items())
    return body + "#" * (1024 - len(body))


CASES: dict[str, Case] = {
    # -- Fedora / RHEL ------------------------------------------------------------------------
    "centos-stream-bls-grubby": Case(
        "Fedora/RHEL",
        "grubby-rhel",
        CENTOS_STREAM,
        {
            "etc/default/grub": RH_BLS_GRUB,
            **_entries(
                "rhel-9",
                "root=/dev/mapper/cs-root ro crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M "
                "resume=/dev/mapper/cs-swap rd.lvm.lv=cs/root rhgb quiet",
            ),
        },
    ),
    "centos-stream-bls-no-grubby": Case(
        "Fedora/RHEL",
        "grub2-rhel",
        CENTOS_STREAM,
        {"etc/default/grub": RH_BLS_GRUB, **_entries("rhel-9", "root=/dev/vda2 ro")},
        refusal="GRUB_ENABLE_BLSCFG=true",
    ),
    "centos7-vfio-ids-of-another-card": Case(
        "Fedora/RHEL",
        "grub2-rhel",
        Found(
            "developer-onizuka/setup-centos7",
            "README.md",
            "e9d7075eb69bcbc881386dbce73bd371da79eae0",
        ),
        {
            "etc/default/grub": "GRUB_TIMEOUT=5\n" + RH_DISTRIBUTOR + "GRUB_DEFAULT=saved\n"
            'GRUB_CMDLINE_LINUX="crashkernel=auto rd.lvm.lv=centos/root rhgb quiet '
            "intel_iommu=on vfio_iommu_type1.allow_unsafe_interrupts=1 iommu=pt "
            'vfio-pci.ids=10de:1cb1,10de:0fb9"\nGRUB_DISABLE_RECOVERY="true"\n'
        },
    ),
    "rhel7-double-blank-no-default": Case(
        "Fedora/RHEL",
        "grub2-rhel",
        Found(
            "TelekomLabs/packer-rhel7",
            "scripts/bootlogs.sh",
            "2d234262d5cd4c4cea6d29860620c92fee2166e2",
        ),
        {
            "etc/default/grub": "GRUB_TIMEOUT=5\n"
            + RH_DISTRIBUTOR
            + 'GRUB_TERMINAL_OUTPUT="console"\n'
            'GRUB_CMDLINE_LINUX="rd.lvm.lv=centos/swap crashkernel=auto  rd.lvm.lv=centos/root '
            'rhgb console=ttyS0"\n'
        },
    ),
    "fedora-exported-colours": Case(
        "Fedora/RHEL",
        "grub2-rhel",
        Found(
            "rogrwhitakr/northern-lights",
            "coreutils/grub.bash",
            "120c898f35ae5d32a5a2b4efd2bebd98146fa9f9",
        ),
        {
            "etc/default/grub": "GRUB_TIMEOUT=15\n" + RH_DISTRIBUTOR + "GRUB_DEFAULT=saved\n"
            'GRUB_CMDLINE_LINUX="rd.lvm.lv=fedora_x/root rd.lvm.lv=fedora_x/swap rhgb quiet"\n'
            'GRUB_BACKGROUND="/root/wood-icon.png"\n'
            'export GRUB_COLOR_NORMAL="white/black"\nexport COLOR_HIGHLIGHT="red/green"\n'
        },
    ),
    "rhel8-kernelopts-in-grubenv": Case(
        "Fedora/RHEL",
        "grubby-rhel",
        KERNELOPTS,
        {
            **_entries("rhel-9", "$kernelopts $tuned_params"),
            "boot/grub2/grubenv": _grubenv(
                saved_entry=f"{MACHINE}-{RELEASE['rhel-9']}",
                kernelopts="root=/dev/mapper/rhel-root ro crashkernel=auto "
                "rd.lvm.lv=rhel/root rhgb quiet iommu=pt",
                tuned_params="",
            ),
        },
    ),
    "rhel8-kernelopts-only-in-grub-cfg": Case(
        "Fedora/RHEL",
        "grubby-rhel",
        KERNELOPTS,
        {
            **_entries("rhel-9", "$kernelopts"),
            "boot/grub2/grubenv": _grubenv(saved_entry="x"),
            "boot/grub2/grub.cfg": 'if [ -z "${kernelopts}" ]; then\n'
            '  set kernelopts="root=/dev/vda2 ro"\nfi\nblscfg\n',
        },
        refusal="$kernelopts is not in /boot/grub2/grubenv but grub.cfg names it",
    ),
    # -- openSUSE -----------------------------------------------------------------------------
    "opensuse-installer-appends-a-second-default": Case(
        "openSUSE",
        "grub2-suse",
        Found(
            "openSUSE/yomi",
            "salt/bootloader/grub2-mkconfig.sls",
            "0ffda707399608ec95a461b3953dccad52fb1f0d",
        ),
        {
            "etc/default/grub": 'GRUB_DISTRIBUTOR=""\n'
            'GRUB_CMDLINE_LINUX_DEFAULT="splash=silent resume=/dev/vda3 quiet"\n'
            'GRUB_CMDLINE_LINUX=""\nGRUB_USE_LINUXEFI="true"\nGRUB_TERMINAL="gfxterm"\n'
            'GRUB_GFXMODE="auto"\nGRUB_BACKGROUND=\nGRUB_TIMEOUT=8\nGRUB_DEFAULT="saved"\n'
            'GRUB_SAVEDEFAULT="true"\nGRUB_CMDLINE_LINUX_DEFAULT="splash=silent quiet"\n'
            'GRUB_DISABLE_OS_PROBER="false"\n',
            "etc/sysconfig/bootloader": 'LOADER_TYPE="grub2-efi"\nSECURE_BOOT="yes"\n',
        },
    ),
    "opensuse-snapshot-booting": Case(
        "openSUSE",
        "grub2-suse",
        Found(
            "openSUSE/yomi",
            "salt/storage/snapper/grub2-mkconfig.sls",
            "a4a1747f6095c5b65e44a1b2aca01e706a6f8f3a",
        ),
        {
            "etc/default/grub": "GRUB_DISTRIBUTOR=\nGRUB_DEFAULT=saved\nGRUB_TIMEOUT=8\n"
            'GRUB_CMDLINE_LINUX_DEFAULT="splash=silent mitigations=auto quiet '
            'security=apparmor"\nGRUB_CMDLINE_LINUX=""\nSUSE_BTRFS_SNAPSHOT_BOOTING="true"\n'
        },
    ),
    "opensuse-openqa-rewrites-the-default": Case(
        "openSUSE",
        "grub2-suse",
        Found(
            "os-autoinst/os-autoinst-distri-opensuse",
            "tests/shutdown/grub_set_bootargs.pm",
            "bee0c6e9460f32ec305029fec450a5fe5fbafec4",
        ),
        {
            # after its sed: quiet taken out, fips=1 added, inside the admin's quotes
            "etc/default/grub": "GRUB_DEFAULT=saved\n"
            'GRUB_CMDLINE_LINUX_DEFAULT=" splash=silent resume=/dev/disk/by-uuid/0b1c '
            'mitigations=auto security=apparmor fips=1"\nGRUB_CMDLINE_LINUX=""\n'
        },
    ),
    # -- Pop!_OS ------------------------------------------------------------------------------
    "popos-default-configuration": Case(
        "Pop!_OS",
        "kernelstub",
        Found("system76/docs", "content/kernelstub.md", "05c10b5b33df954814139591b3adc95cc20e4754"),
        {
            "etc/kernelstub/configuration": json.dumps(
                {
                    "default": {"kernel_options": ["quiet", "splash"], "esp_path": "/boot/efi"},
                    "user": {
                        "kernel_options": [
                            "quiet",
                            "loglevel=0",
                            "systemd.show_status=false",
                            "splash",
                        ],
                        "esp_path": "/boot/efi",
                        "setup_loader": False,
                        "manage_mode": False,
                        "force_update": False,
                        "live_mode": False,
                        "config_rev": 3,
                    },
                },
                indent=2,
            ),
            "boot/efi/loader/entries/Pop_OS-current.conf": "title Pop!_OS\n"
            "linux /EFI/Pop_OS-0b1c/vmlinuz.efi\ninitrd /EFI/Pop_OS-0b1c/initrd.img\n"
            "options root=UUID=0b1c ro quiet loglevel=0 systemd.show_status=false splash\n",
        },
    ),
    "popos-kernel-options-as-a-string": Case(
        "Pop!_OS",
        "kernelstub",
        Found(
            "isantop/kernelstub", "kernelstub/config.py", "09cc69dc0a393e79f707621a1a0b1c547a69a056"
        ),
        {
            # an OEM's or a config_rev 2 configuration: one string, which kernelstub splits
            "etc/kernelstub/configuration": json.dumps(
                {
                    "default": {"kernel_options": "quiet splash", "config_rev": 2},
                    "user": {"kernel_options": "quiet splash intel_iommu=off", "config_rev": 2},
                }
            ),
        },
    ),
    "popos-no-user-section": Case(
        "Pop!_OS",
        "kernelstub",
        Found(
            "isantop/kernelstub", "kernelstub/config.py", "09cc69dc0a393e79f707621a1a0b1c547a69a056"
        ),
        {
            # kernelstub copies "default" into "user" where there is none
            "etc/kernelstub/configuration": json.dumps(
                {
                    "default": {
                        "kernel_options": ["quiet", "splash", "intel_iommu=off"],
                        "config_rev": 3,
                    }
                }
            ),
        },
    ),
    # -- Proxmox on ZFS -----------------------------------------------------------------------
    "proxmox-zfs-one-line": Case(
        "Proxmox on ZFS",
        "proxmox",
        Found(
            "Rau-N/DIY-Home-Server-Build",
            "docs/iommu.md",
            "89d1cbf202974382ee14627332cfc7d8ae11c9b3",
        ),
        {
            "etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet intel_iommu=on iommu=pt\n"
        },
    ),
    "proxmox-zfs-no-newline": Case(
        "Proxmox on ZFS",
        "proxmox",
        PBT_HOOK,
        {"etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs"},
    ),
    "proxmox-zfs-second-line-unread": Case(
        "Proxmox on ZFS",
        "proxmox",
        Found(
            "jiangcuo/proxmox-kernel-helper",
            "src/proxmox-boot/functions",
            "5999d616f8fbf5e2c4bec6fe28ce20c874170195",
        ),
        # a line appended with `echo … >> /etc/kernel/cmdline`: get_first_line never reads it
        {"etc/kernel/cmdline": "root=ZFS=rpool/ROOT/pve-1 boot=zfs quiet\nintel_iommu=off\n"},
    ),
    "proxmox-zfs-comment-first": Case(
        "Proxmox on ZFS",
        "proxmox",
        PBT_HOOK,
        {"etc/kernel/cmdline": "# ZFS root\nroot=ZFS=rpool/ROOT/pve-1 boot=zfs\n"},
        refusal="proxmox-boot-tool reads only its first line, which has no root=",
    ),
    # -- NixOS --------------------------------------------------------------------------------
    "nixos-kernel-params-and-initrd-modules": Case(
        "NixOS",
        "nixos",
        Found(
            "sk4rd/nix-config", "hosts/desktop/boot.nix", "5a3df8221e6b3fd1d7425f0cfdec3e5bdb51da2b"
        ),
        {
            "etc/nixos/configuration.nix": "{ ... }:\n{\n  boot = {\n"
            "    loader.systemd-boot.enable = true;\n"
            '    kernelParams = [ "iommu=pt" "vfio-pci.ids=1002:744c,1002:ab30" ];\n'
            '    initrd.kernelModules = [ "vfio_pci" "vfio" "vfio_iommu_type1" ];\n  };\n}\n'
        },
    ),
    "nixos-module-with-optional-ids": Case(
        "NixOS",
        "nixos",
        Found(
            "Nanamiiiii/dotfiles",
            "nixos/settings/system/vfio.nix",
            "5fb073912420456338ceb6cf27d6120f30ab87e9",
        ),
        {
            "etc/nixos/configuration.nix": "{ lib, vfioIds ? null, ... }:\n{\n"
            '  boot.kernelParams = [ "intel_iommu=on" "iommu=pt" ]\n'
            '    ++ lib.optional (vfioIds != null) ("vfio_pci.ids=" + '
            'lib.concatStringsSep "," vfioIds);\n}\n'
        },
    ),
    "nixos-extra-modprobe-config-string": Case(
        "NixOS",
        "nixos",
        Found(
            "marsiwiec/nixconfig",
            "systems/modules/labnix/vfio.nix",
            "79659b0067ce42505545494f337c8bab400cf4d7",
        ),
        {
            "etc/nixos/configuration.nix": "{ config, ... }:\n{\n"
            '  boot.kernelParams = [ "amd_iommu=on" ];\n'
            '  boot.blacklistedKernelModules = [ "nvidia" "nouveau" ];\n'
            '  boot.extraModprobeConfig = "options vfio-pci ids=10de:1c02,10de:10f1";\n}\n'
        },
    ),
    "nixos-systemd-boot-quiet": Case(
        "NixOS",
        "nixos",
        Found("nzxl101/nix-config", "modules/boot.nix", "9b2ec83a6dcc07140de89fa8949c06be09aae037"),
        {
            "etc/nixos/configuration.nix": "{\n  boot.loader.systemd-boot.enable = true;\n"
            "  boot.initrd.kernelModules = [];\n"
            '  boot.kernelParams = [ "quiet" "splash" "udev.log_priority=3" ];\n}\n',
            "etc/nixos/hardware-configuration.nix": "{ ... }: {\n"
            '  boot.initrd.availableKernelModules = [ "xhci_pci" "nvme" ];\n}\n',
        },
    ),
}

FOUND = sorted({(c.family, c.found.repo, c.found.path, c.found.commit) for c in CASES.values()})


# -- the hosts ------------------------------------------------------------------------------

HOSTS: dict[str, tuple[str, dict[str, object]]] = {
    "grub2-rhel": ("rhel-9", {"boot": {"bootloader": "grub", "initramfs": "dracut"}}),
    "grub2-suse": ("opensuse-tumbleweed", {}),
    "grubby-rhel": ("rhel-9", {}),
    "grubby-fedora": ("fedora-40", {}),
    "kernelstub": ("popos-22.04", {}),
    "proxmox": ("proxmox-8", {}),
}


def host(tmp_path: Path, case: Case) -> Path:
    distro, overrides = HOSTS[case.host]
    path = build_variant(tmp_path, "consumer-intel", distro=distro, **overrides)
    if case.host.startswith("grub2"):
        _script(path, upstream_text(), "grub2-mkconfig")  # the real script, upstream's reading
    if any(f.startswith("boot/loader/entries/") for f in case.files):
        shutil.rmtree(path / "boot/loader/entries", ignore_errors=True)
    for rel, text in case.files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return path


def _source(tmp_path: Path, case: Case, rel: str) -> Path:
    """The case's file where the real-config tier's shapes copy it from."""
    src = tmp_path / "case" / Path(rel).name
    src.parent.mkdir(exist_ok=True)
    src.write_text(case.files[rel])
    return src


class ProxmoxCmdline(Cmdline):
    """/etc/kernel/cmdline as proxmox-boot-tool reads it: the first line only."""

    def read(self) -> list[str]:
        return proxmox_first_line(self.path)

    def expect(self, before: list[str], after: list[str], plan: object) -> None:
        change = plan.kernel_args  # type: ignore[attr-defined]
        stay = kept(before, change)
        assert after == stay + [a for a in change.set.values() if a not in stay]
        rest = self.source.read_text().partition("\n")[2]
        assert (self.path / self.FILE).read_text().partition("\n")[2] == rest  # unread, as it was

    def edit(self) -> tuple[Path, bytes, str]:
        file = self.path / self.FILE
        old = file.read_bytes()
        first, newline, rest = old.decode().partition("\n")
        file.write_text(first + " nomodeset" + newline + rest)
        return file, old, "nomodeset"


# -- the stand-ins for tools that cannot run here --------------------------------------------


def _update(args: list[str], remove: list[str], add: list[str]) -> list[str]:
    """grubby-bls's update_args: take out the keys removed and those added, append the added."""
    gone = {key_of(a) for a in remove} | {key_of(a) for a in add}
    return [a for a in args if key_of(a) not in gone] + add


def grubby_stand_in(root: Path, argv: tuple[str, ...]) -> None:
    """STAND-IN for ``grubby --update-kernel=ALL --args=… --remove-args=…``: each entry's
    ``options``, or grubenv's ``kernelopts`` where an entry uses ``$kernelopts``."""
    assert argv[:2] == ("grubby", "--update-kernel=ALL"), argv
    add = [w for a in argv if a.startswith("--args=") for w in a[7:].split()]
    remove = [w for a in argv if a.startswith("--remove-args=") for w in a[14:].split()]
    env_path = root / "boot/grub2/grubenv"
    for entry in sorted((root / "boot/loader/entries").glob("*.conf")):
        lines = entry.read_text().split("\n")
        for n, line in enumerate(lines):
            if not line.startswith("options "):
                continue
            if "$kernelopts" in line:
                env = grubenv(root)
                new = " ".join(_update(env["kernelopts"].split(), remove, add))
                text = env_path.read_text()
                env_path.write_text(
                    re.sub(
                        r"^kernelopts=.*$",
                        lambda _m, new=new: f"kernelopts={new}",
                        text,
                        flags=re.M,
                    )
                )
            else:
                lines[n] = "options " + " ".join(_update(line[8:].split(), remove, add))
        entry.write_text("\n".join(lines))


def kernelstub_stand_in(root: Path, argv: tuple[str, ...]) -> None:
    """STAND-IN for ``kernelstub -a X -d Y …``: it saves ``user.kernel_options`` as a list
    (from ``default`` where there is no ``user``), ``-d`` takes an option out, ``-a`` adds one
    it does not have yet."""
    assert argv[0] == "kernelstub", argv
    path = root / "etc/kernelstub/configuration"
    data = json.loads(path.read_text())
    opts = kernelstub_options(root)
    for flag, opt in zip(argv[1::2], argv[2::2], strict=True):
        if flag == "-d":
            opts = [o for o in opts if o != opt]
        elif opt not in opts:
            opts.append(opt)
    data["user"] = {**data.get("user", data.get("default", {})), "kernel_options": opts}
    path.write_text(json.dumps(data, indent=2))


def _bls_read(path: Path) -> list[str]:
    (entry,) = [e for e in (path / "boot/loader/entries").glob("*.conf") if "rescue" not in e.name]
    return bls_options(path, entry)


TOOLS: dict[str, tuple[Callable[[Path, tuple[str, ...]], None], Callable[[Path], list[str]]]] = {
    "grubby": (grubby_stand_in, _bls_read),
    "kernelstub": (kernelstub_stand_in, kernelstub_options),
}
EDIT = {
    "grubby": ("grubby", "--update-kernel=ALL", "--args=nomodeset"),
    "kernelstub": ("kernelstub", "-a", "nomodeset"),
}


def through_tool(path: Path, tool: str, capsys: pytest.CaptureFixture[str]) -> bool:
    """Plan, apply (the commands listed, as on any tree that is not a live root), the
    stand-in running them on the files the tool reads, a second plan, the admin's change
    through the same tool, undo's commands, undo."""
    stand_in, read = TOOLS[tool]
    before_tree = tree(path)
    before = read(path)
    root = HostRoot(str(path))
    plan = planned(path, OPTS, capsys)
    if plan is None:
        return False
    runs = [a for a in plan.actions if isinstance(a, Run) and a.argv[0] == tool]
    assert runs, plan.actions
    apply(root, plan, plan.record())
    assert read(path) == before  # listed, not run: nothing of the tool's was written by us
    saved = {p: p.read_bytes() for p in _tool_files(path)}
    for run in runs:
        stand_in(path, run.argv)
    after = read(path)
    change = plan.kernel_args
    ours_in_effect(after, change)
    iommu_on(after)
    others = [a for a in kept(before, change) if key_of(a) not in change.set]
    assert [a for a in after if key_of(a) not in change.set] == others, (before, after)
    assert make_plan(root, discover(str(path)), OPTS)[0].kernel_args.is_empty()
    stand_in(path, EDIT[tool])  # the admin's change, through the tool
    assert "nomodeset" in read(path)
    assert make_plan(root, discover(str(path)), OPTS)[0].kernel_args.is_empty()
    for run in reversed(runs):  # the -a run's inverse also puts back what -d took out
        if run.undo_argv is not None:
            stand_in(path, run.undo_argv)
    back = read(path)
    assert "nomodeset" in back and not [
        a for a in change.set.values() if a in back and a not in before
    ]
    for p, data in saved.items():  # what the tool rewrote: as it was, to compare our files
        p.write_bytes(data)
    undo(root)
    assert tree(path) == before_tree
    return True


def iommu_on(args: list[str]) -> None:
    """No IOMMU switched off by the value the kernel keeps (the last)."""
    for key in ("intel_iommu", "amd_iommu", "iommu"):
        assert [a for a in args if key_of(a) == key][-1:] != [f"{key}=off"], args


def _tool_files(path: Path) -> list[Path]:
    found = [path / "etc/kernelstub/configuration", path / "boot/grub2/grubenv"]
    found += sorted((path / "boot/loader/entries").glob("*.conf"))
    return [p for p in found if p.exists()]


# -- the tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.host != "nixos"])
def test_collected_case(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = CASES[name]
    path = host(tmp_path, case)
    if case.refusal:
        with pytest.raises(PassthroughError, match=re.escape(case.refusal)):
            make_plan(HostRoot(str(path)), discover(str(path)), OPTS)
    if case.host.startswith("grubby") or case.host == "kernelstub":
        done = through_tool(path, "kernelstub" if case.host == "kernelstub" else "grubby", capsys)
    elif case.host == "proxmox":
        rel = "etc/kernel/cmdline"
        shape = ProxmoxCmdline(path, tmp_path, _source(tmp_path, case, rel), "/" + rel, "")
        done = exercise(shape, path, OPTS, capsys)
    else:
        rel = "etc/default/grub"
        shape = Grub(path, tmp_path, _source(tmp_path, case, rel), "/" + rel, "upstream")
        done = exercise(shape, path, OPTS, capsys)
    assert done != bool(case.refusal), f"{name}: {'applied' if done else 'refused'}"


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.host == "nixos"])
def test_collected_nixos_case_is_refused_with_the_lines(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nixos-rebuild cannot run here, and /etc is its output: plan and apply stop with the
    configuration.nix lines, whatever the host's own .nix files hold, and write nothing."""
    root = tmp_path / "root"
    assert main(["sample", "build", "nixos-desktop", str(root)]) == 0
    for rel, text in CASES[name].files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    before = tree(root)
    for command in (["plan"], ["apply", "--yes"]):
        capsys.readouterr()
        assert main([*command, "--root", str(root)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert "NixOS generates /etc" in err[0] and "configuration.nix" in err[0], err
        assert err[1].startswith("  boot.kernelParams = [ ") and "vfio-pci.ids=" in err[1], err
        assert err[2] == '  boot.initrd.kernelModules = [ "vfio_pci" "vfio" "vfio_iommu_type1" ];'
    assert tree(root) == before


def test_every_family_has_cases_and_every_case_names_its_source() -> None:
    families = {c.family for c in CASES.values()}
    assert families == {"Fedora/RHEL", "openSUSE", "Pop!_OS", "Proxmox on ZFS", "NixOS"}
    for case in CASES.values():
        assert re.fullmatch(r"[0-9a-f]{40}", case.found.commit), case.found
    docs = (Path(__file__).parents[1] / "docs/bootloaders.md").read_text()
    for _family, repo, path, commit in FOUND:
        assert f"`{repo}` `{path}` `{commit[:12]}`" in docs, (repo, path)
