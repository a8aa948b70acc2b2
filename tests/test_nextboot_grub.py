# SPDX-License-Identifier: Apache-2.0
"""Which grub.cfg entry the next boot takes (boot/grub.py), on grub.cfg files
written by the real GRUB of this machine.

The header (where ``GRUB_DEFAULT`` lands as ``set default=…``) is the output of this
machine's real ``/etc/grub.d/00_header`` run with each ``GRUB_DEFAULT``; the environment
block is written by the real ``grub-editenv`` (what ``grub-set-default`` and
``grub-reboot`` call). The menu is a real ``grub-mkconfig`` run's: the cached Debian tree's
grub.cfg (made by ``update-grub`` in that tree, tests/conftest.py ``debian_tree``) in the
slow tier; in the quick tier, a menu of the shape its 10_linux writes (two kernels, the
Advanced submenu, ids through ``$menuentry_id_option``), written here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from passthrough.actions import PlanRecord
from passthrough.boot import grub, readback
from passthrough.host.root import HostRoot

HEADER = Path("/etc/grub.d/00_header")
ID = "$menuentry_id_option"
MENU = f"""### BEGIN /etc/grub.d/10_linux ###
function gfxmode {{
	set gfxpayload="${{1}}"
}}
menuentry 'Debian GNU/Linux' --class debian --class os {ID} 'gnulinux-simple-u1' {{
	load_video
	linux	/boot/vmlinuz-6.1.0-28-amd64 root=UUID=u1 ro  quiet iommu=pt NEWEST
	initrd	/boot/initrd.img-6.1.0-28-amd64
}}
submenu 'Advanced options for Debian GNU/Linux' {ID} 'gnulinux-advanced-u1' {{
	menuentry 'Debian GNU/Linux, with Linux 6.1.0-28-amd64' --class debian {ID} 'gnulinux-6.1.0-28-amd64-advanced-u1' {{
		linux	/boot/vmlinuz-6.1.0-28-amd64 root=UUID=u1 ro  quiet iommu=pt NEWEST
	}}
	menuentry 'Debian GNU/Linux, with Linux 6.1.0-28-amd64 (recovery mode)' --class debian {ID} 'gnulinux-6.1.0-28-amd64-recovery-u1' {{
		linux	/boot/vmlinuz-6.1.0-28-amd64 root=UUID=u1 ro single RECOVERY
	}}
	menuentry 'Debian GNU/Linux, with Linux 6.1.0-27-amd64' --class debian {ID} 'gnulinux-6.1.0-27-amd64-advanced-u1' {{
		linux	/boot/vmlinuz-6.1.0-27-amd64 root=UUID=u1 ro  quiet iommu=pt OLDER
	}}
}}
### END /etc/grub.d/10_linux ###
### BEGIN /etc/grub.d/30_uefi-firmware ###
menuentry 'UEFI Firmware Settings' {ID} 'uefi-firmware' {{
	fwsetup
}}
### END /etc/grub.d/30_uefi-firmware ###
"""


def header(grub_default: str) -> str:
    """What the real 00_header writes for ``GRUB_DEFAULT``."""
    assert HEADER.exists(), "this machine has no /etc/grub.d/00_header (grub2-common)"
    return subprocess.run(
        [str(HEADER)],
        env={
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "GRUB_DEFAULT": grub_default,
            "pkgdatadir": "/usr/share/grub",
            "GRUB_TIMEOUT": "5",
        },
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def grubenv(tmp_path: Path, **values: str) -> str:
    """An environment block written by the real grub-editenv."""
    path = tmp_path / "grubenv"
    subprocess.run(["grub-editenv", str(path), "create"], check=True)
    for name, value in values.items():
        subprocess.run(["grub-editenv", str(path), "set", f"{name}={value}"], check=True)
    return path.read_text()


@pytest.mark.parametrize(
    ("grub_default", "env", "marker"),
    [
        ("0", {}, "NEWEST"),
        ("1>2", {}, "OLDER"),
        ("1>1", {}, "RECOVERY"),
        ("gnulinux-advanced-u1>gnulinux-6.1.0-27-amd64-advanced-u1", {}, "OLDER"),
        (
            "Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.1.0-27-amd64",
            {},
            "OLDER",
        ),
        ("gnulinux-simple-u1", {}, "NEWEST"),
        ("saved", {}, "NEWEST"),  # nothing saved yet: the first entry
        ("saved", {"saved_entry": "1>2"}, "OLDER"),
        # grub-reboot: next_entry wins for the next boot, whatever GRUB_DEFAULT says
        ("saved", {"saved_entry": "1>2", "next_entry": "1>1"}, "RECOVERY"),
        ("0", {"next_entry": "gnulinux-advanced-u1>gnulinux-6.1.0-27-amd64-advanced-u1"}, "OLDER"),
    ],
)
def test_grub_default_picks_the_entry_grub_boots(
    tmp_path: Path, grub_default: str, env: dict[str, str], marker: str
) -> None:
    choice = grub.choose(header(grub_default) + MENU, grubenv(tmp_path, **env))
    assert choice.unclear is None and choice.args is not None, choice
    assert choice.args[-1] == marker


@pytest.mark.parametrize(
    ("grub_default", "env", "why"),
    [
        ("7", {}, "default '7' names no entry of it"),
        ("gnulinux-6.1.0-26-amd64-advanced-u1", {}, "names no entry"),  # a removed kernel
        ("1", {}, "is a submenu ('Advanced options for Debian GNU/Linux')"),
        ("2", {}, "('UEFI Firmware Settings') has no linux line"),
        ("saved", {"saved_entry": "Windows Boot Manager"}, "names no entry"),
    ],
)
def test_a_default_that_cannot_be_resolved_is_unclear(
    tmp_path: Path, grub_default: str, env: dict[str, str], why: str
) -> None:
    choice = grub.choose(header(grub_default) + MENU, grubenv(tmp_path, **env))
    assert choice.args is None and choice.unclear is not None and why in choice.unclear


def test_a_default_from_another_variable_is_unclear() -> None:
    cfg = 'set default="${chosen_by_script}"\n' + MENU
    assert grub.choose(cfg, None).unclear == "default is set from ${chosen_by_script}"


def test_a_grub_cfg_without_menuentries_is_unclear() -> None:
    assert grub.choose("insmod blscfg\nblscfg\n", None).unclear == "it has no menuentry"


def test_steps_split_on_single_angle_brackets_only() -> None:
    assert grub.steps("a>>b>c") == ["a>b", "c"]
    assert grub.steps("0") == ["0"]


def test_check_grub_judges_the_default_entry_and_names_it(tmp_path: Path) -> None:
    """GRUB_DEFAULT points at the older kernel, which lacks our argument: a failure, even
    though the first entry has it."""
    (tmp_path / "boot/grub").mkdir(parents=True)
    (tmp_path / "boot/grub/grub.cfg").write_text(header("1>2") + MENU)
    record = PlanRecord.from_json({"kernel_args": {"set": ["NEWEST"]}, "bootloader": "grub"})
    out = readback.NextBoot()
    grub.check_grub(HostRoot(str(tmp_path)), record, out)
    assert out.missing == [
        "/boot/grub/grub.cfg (default '1>2', 'Debian GNU/Linux, with Linux 6.1.0-27-amd64'): NEWEST"
    ]
    # grub-reboot to the newest: judged for the next boot only, and it passes
    (tmp_path / "boot/grub/grubenv").write_text(grubenv(tmp_path, next_entry="0"))
    out = readback.NextBoot()
    grub.check_grub(HostRoot(str(tmp_path)), record, out)
    assert out.missing == [] and out.checked == ["/boot/grub/grub.cfg"]


def test_check_grub_says_it_could_not_tell(tmp_path: Path) -> None:
    (tmp_path / "boot/grub2").mkdir(parents=True)
    (tmp_path / "boot/grub2/grub.cfg").write_text(header("1") + MENU)
    record = PlanRecord.from_json({"kernel_args": {"set": ["NEWEST"]}, "bootloader": "grub"})
    out = readback.NextBoot(ran=[["grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"]])
    grub.check_grub(HostRoot(str(tmp_path)), record, out)
    assert out.missing == [] and out.checked == []
    assert out.unchecked == [
        "/boot/grub2/grub.cfg (could not tell which entry boots: default '1' is a submenu "
        "('Advanced options for Debian GNU/Linux'), not an entry)"
    ]


def test_a_real_grub_mkconfig_menu(debian_tree: Path, tmp_path: Path) -> None:
    """The Debian tree's grub.cfg, as its real grub-mkconfig wrote it, with the header of
    each GRUB_DEFAULT in place of its own."""
    real = (debian_tree / "boot/grub/grub.cfg").read_text()
    body = re.sub(
        r"### BEGIN /etc/grub.d/00_header ###.*?### END /etc/grub.d/00_header ###\n",
        "",
        real,
        flags=re.S,
    )
    assert body != real and "submenu" in body
    ids = re.findall(r"\$menuentry_id_option '([^']+)'", body)
    simple, advanced, kernel, recovery = ids[:4]
    assert simple.startswith("gnulinux-simple-") and "-recovery-" in recovery
    cases = {
        "0": "quiet",
        "saved": "quiet",
        simple: "quiet",
        f"{advanced}>{kernel}": "quiet",
        "1>1": "single",
        f"{advanced}>{recovery}": "single",
    }
    for grub_default, last in cases.items():
        choice = grub.choose(header(grub_default) + body, grubenv(tmp_path))
        assert choice.args is not None, (grub_default, choice)
        assert choice.args[0].startswith("root=") and choice.args[-1] == last, choice.args
    assert grub.choose(header("1") + body, None).unclear is not None
