# SPDX-License-Identifier: Apache-2.0
"""Plans for each distro family, as golden files (diffs and commands), and the refusals."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from passthrough import fakehost
from passthrough.actions import Plan
from passthrough.cli import main
from passthrough.host.discover import discover
from passthrough.host.root import MAX_FILE, HostRoot
from passthrough.journal.apply import apply
from passthrough.plan.build import PlanOptions, make_plan

from .bootread import grub_line
from .conftest import GOLDEN, assert_golden, run_ok, tree_hash


def cloud_dropin(root: Path) -> None:
    d = root / "etc/default/grub.d"
    d.mkdir(parents=True, exist_ok=True)
    # Ubuntu cloud images override the main file from a drop-in
    (d / "50-cloudimg-settings.cfg").write_text(
        '# Cloud Image specific Grub settings\nGRUB_CMDLINE_LINUX_DEFAULT="console=tty1 console=ttyS0 amd_iommu=on"\n'
        "GRUB_TIMEOUT=0\n"
    )


def nothing(root: Path) -> None:
    del root


CASES: dict[str, tuple[str, dict[str, Any], PlanOptions, Callable[[Path], None]]] = {
    "debian12-grub-intel": ("consumer-intel", {}, PlanOptions(), nothing),
    "ubuntu2404-grub.d-amd": (
        "amd-b550-chipset",
        {},
        PlanOptions(gpus=("0000:2d:00.0",), allow_boot_gpu=True),
        cloud_dropin,
    ),
    "rhel9-grubby-dracut-amd-override": (
        "epyc-v100",
        {},
        PlanOptions(gpus=("03:00.0", "04:00.0")),
        nothing,
    ),
    "silverblue-rpm-ostree-intel": (
        "optimus-laptop",
        {"boot": {"bootloader": "rpm-ostree", "initramfs": "dracut"}},
        PlanOptions(),
        nothing,
    ),
    "proxmox8-systemd-boot-amd": ("acs-override-proxmox", {}, PlanOptions(), nothing),
    "arch-mkinitcpio-systemd-boot-amd": (
        "root-nvme-in-group",
        {},
        PlanOptions(gpus=("0a:00.0",), allow_boot_gpu=True),
        nothing,
    ),
    "popos-kernelstub-intel": ("consumer-intel", {"distro": "popos-22.04"}, PlanOptions(), nothing),
    "ubuntu2404-hgx-default-on-hugepages": ("hgx-h100", {}, PlanOptions(hugepages_1g=64), nothing),
    "debian12-apu-igpu": (
        "amd-apu-desktop",
        {},
        PlanOptions(gpus=("30:00.0",), allow_boot_gpu=True),
        nothing,
    ),
    "ubuntu2404-arc-a770": ("intel-arc-a770", {}, PlanOptions(gpus=("03:00.0",)), nothing),
    "arch-turing-4fn": ("turing-desktop", {}, PlanOptions(), nothing),
    "arch-systemd-boot-entries-turing": (
        "turing-desktop",
        {"distro": "arch-systemd-boot-entries"},
        PlanOptions(),
        nothing,
    ),
    "debian12-iommu-off": (
        "iommu-off",
        {},
        PlanOptions(gpus=("01:00.0",), allow_boot_gpu=True),
        nothing,
    ),
}


def build(tmp_path: Path, name: str, overrides: dict[str, Any]) -> Path:
    desc = fakehost.load(name)
    return fakehost.build(fakehost.Description({**desc.data, **overrides}, name), tmp_path / "root")


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_golden(case: str, tmp_path: Path, regenerate: bool) -> None:
    name, overrides, opts, tweak = CASES[case]
    path = build(tmp_path, name, overrides)
    tweak(path)
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), opts)
    data = plan.to_json(root)
    data["root"] = "<root>"
    got = json.dumps(data, indent=2) + "\n"
    golden = GOLDEN / "plan" / f"{case}.json"
    assert_golden(golden, got, regenerate, "plan")


def _plan(path: Path, opts: PlanOptions) -> dict[str, Any]:
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), opts)
    return plan.to_json(root)


def test_intel_default_on_kernel_gets_no_intel_iommu(tmp_path: Path) -> None:
    data = _plan(build(tmp_path, "hgx-h100", {}), PlanOptions())
    assert not any(a.startswith("intel_iommu") for a in data["kernel_args"]["set"])
    debian = _plan(
        build(
            tmp_path / "d",
            "consumer-intel",
            {"kernel": {"cmdline": "root=/dev/nvme0n1p2 ro quiet"}},
        ),
        PlanOptions(),
    )
    # Debian builds its kernels "on, except for an integrated GPU": nothing to add for a card
    assert not any(a.startswith("intel_iommu") for a in debian["kernel_args"]["set"])
    # a kernel whose default is off needs it
    off = _plan(
        build(tmp_path / "o", "iommu-off", {}), PlanOptions(gpus=("01:00.0",), allow_boot_gpu=True)
    )
    assert "intel_iommu=on" in off["kernel_args"]["set"]


def test_amd_never_gets_amd_iommu_on(tmp_path: Path) -> None:
    path = build(tmp_path, "amd-b550-chipset", {})
    cloud_dropin(path)
    data = _plan(path, PlanOptions(gpus=("2d:00.0",), allow_boot_gpu=True))
    assert "amd_iommu" in data["kernel_args"]["remove"]
    assert not any("amd_iommu" in a for a in data["kernel_args"]["set"])
    dropin = next(a for a in data["actions"] if a.get("path", "").endswith("99-passthrough.cfg"))
    assert "amd_iommu" not in dropin["diff"].split("+for _passthrough_arg in ")[1]


def test_softdeps_are_derived_for_a_turing_card(tmp_path: Path) -> None:
    path = build(tmp_path, "two-gpus-one-group", {})
    data = _plan(path, PlanOptions(gpus=("01:00.0", "02:00.0"), allow_boot_gpu=True))
    conf = next(
        a for a in data["actions"] if a.get("path") == "/etc/modprobe.d/passthrough-vfio.conf"
    )["diff"]
    for module in (
        "nvidia",
        "nouveau",
        "nvidia_drm",
        "snd_hda_intel",
        "xhci_pci",
        "i2c_nvidia_gpu",
    ):
        assert f"+softdep {module} pre: vfio-pci" in conf, module
    assert "vfio_pci pre" not in conf
    assert (
        "+options vfio-pci ids=10de:2204,10de:1aef,10de:1e84,10de:10f8,10de:1ad8,10de:1ad9" in conf
    )
    # dracut host: rd.driver.pre and a *.conf drop-in
    assert "rd.driver.pre=vfio-pci" in data["kernel_args"]["set"]
    assert any(
        a.get("path") == "/etc/dracut.conf.d/10-passthrough-vfio.conf" for a in data["actions"]
    )


def test_softdeps_of_an_applied_host_stay_after_the_reboot(tmp_path: Path) -> None:
    """Applied, then rebooted: the card's functions are on vfio-pci, so no host driver is
    "bound now"; the plan keeps what the applied file says and changes nothing (the lab's
    second host play found this: the file was rewritten, the initramfs rebuilt, a reboot)."""
    path = build(tmp_path, "consumer-intel", {})
    _apply_plan(path, PlanOptions())
    conf = (path / "etc/modprobe.d/passthrough-vfio.conf").read_text()
    assert "# snd_hda_intel: bound to 0000:01:00.1 now" in conf
    (path / "sys/bus/pci/drivers/vfio-pci").mkdir(parents=True, exist_ok=True)
    for address in ("0000:01:00.0", "0000:01:00.1"):
        device = (path / "sys/bus/pci/devices" / address).resolve()
        (device / "driver").unlink()
        (device / "driver").symlink_to(
            os.path.relpath(path / "sys/bus/pci/drivers/vfio-pci", device)
        )
        uevent = device / "uevent"  # what discover reads first
        uevent.write_text(re.sub(r"(?m)^DRIVER=.*$", "DRIVER=vfio-pci", uevent.read_text()))
    data = _plan(path, PlanOptions())
    assert not any(
        a.get("path") == "/etc/modprobe.d/passthrough-vfio.conf" for a in data["actions"]
    )
    assert (path / "etc/modprobe.d/passthrough-vfio.conf").read_text() == conf


def test_identical_kept_cards_switch_to_driver_override(tmp_path: Path) -> None:
    data = _plan(build(tmp_path, "epyc-v100", {}), PlanOptions(gpus=("03:00.0", "04:00.0")))
    assert data["binding"] == "driver_override"
    assert not any(a.startswith("vfio-pci.ids") for a in data["kernel_args"]["set"])
    rule = next(a for a in data["actions"] if a.get("path", "").startswith("/etc/udev/rules.d/"))[
        "diff"
    ]
    assert 'KERNEL=="0000:03:00.0", ATTR{driver_override}="vfio-pci"' in rule
    assert "0000:07:00.0" not in rule
    assert any("keeps 0000:07:00.0" in n for n in data["notes"])


REFUSALS = [
    ("bmc-only-server", ["--gpu", "03:00.0"], "[bmc-vga]"),
    (
        "root-nvme-in-group",
        ["--gpu", "05:00.0", "--include-group"],
        "[root-disk-in-group]",
    ),
    ("amd-b550-chipset", ["--gpu", "2b:00.0", "--include-group"], "[route-nic-in-group]"),
    ("epyc-v100", ["--gpu", "03:00.0"], "[group-other-gpu]"),
    ("consumer-intel", ["--gpu", "00:02.0"], "[boot-gpu]"),
    ("consumer-intel", ["--gpu", "0000:99:00.0"], "matches no GPU"),
    ("consumer-intel", ["--gpu", "01:00"], "neither a PCI address"),
    ("consumer-intel", ["--gpu", "10de:zzzz"], "neither a PCI address"),
    ("bmc-only-server", [], "no viable NVIDIA GPU"),
    # the IOMMU off: the way forward is to turn it on, not to name a card
    ("iommu-off", [], "`passthrough plan --iommu-only` turns it on"),
    ("consumer-intel", ["--gpu", "10de:9999"], "matches no GPU"),
]


@pytest.mark.parametrize(("name", "args", "needle"), REFUSALS)
def test_refusals_exit_2_and_write_nothing(
    name: str, args: list[str], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, name, {})
    before = tree_hash(path)
    for command in ("plan", "apply"):
        assert main([command, "--root", str(path), *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("\n") == 1, err
    assert tree_hash(path) == before


def test_every_command_reads_gpu_the_same_way(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One choose_cards(): a vendor:device ID takes the same cards in plan, render and
    kubevirt (hgx-h100: eight H100 SXM, 10de:2330), and a value that names no card is the
    same one-line refusal, exit 2, in each."""
    root = str(hosts["hgx-h100"])
    assert main(["plan", "--root", root, "--gpu", "10de:2330", "--json"]) == 0
    planned = {c["address"] for c in json.loads(capsys.readouterr().out)["cards"]}
    assert len(planned) == 8
    assert main(["render", "--root", root, "--name", "g", "--gpu", "10de:2330", "--json"]) == 0
    xml = json.loads(capsys.readouterr().out)["xml"]
    assert main(["render", "--root", root, "--name", "g", "--gpu", "18:00.0", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)["xml"]
    rendered = {
        f"{int(d, 16):04x}:{int(b, 16):02x}:{int(s, 16):02x}.{int(f, 16)}"
        for d, b, s, f in re.findall(
            r"<source>\s*<address domain='(\w+)' bus='(\w+)' slot='(\w+)' function='(\w+)'",
            xml,
        )
    }
    assert rendered == planned and one.count("<hostdev") == 1
    assert main(["kubevirt", "preflight", "--root", root, "--gpu", "10de:2330", "--json"]) in (0, 1)
    checked = json.loads(capsys.readouterr().out)["checks"]
    bound = [c["summary"] for c in checked if c["id"] == "kube-vfio-bound"]
    assert sorted(s.split(": ")[0] for s in bound) == sorted(planned)
    for argv in (
        ["plan", "--root", root],
        ["render", "--root", root, "--name", "g"],
        ["kubevirt", "render", "--root", root, "--name", "g"],
        ["kubevirt", "preflight", "--root", root],
    ):
        assert main([*argv, "--gpu", "10de:9999"]) == 2, argv
        err = capsys.readouterr().err
        assert "--gpu 10de:9999: matches no GPU on this host" in err and err.count("\n") == 1


def test_grubby_and_rpm_ostree_undo_put_back_what_the_change_replaced(
    hosts: dict[str, Path],
) -> None:
    """Their undo commands come from kargs.invert: a replaced value comes back, an added
    argument goes, a dropped one returns."""
    from passthrough.boot.families import Grubby, RpmOstree
    from passthrough.kargs import ArgChange

    change = ArgChange(
        set={"iommu": "iommu=pt", "intel_iommu": "intel_iommu=on"}, drop=frozenset({"amd_iommu"})
    )
    before = ["quiet", "iommu=soft", "amd_iommu=on"]
    path = str(hosts["epyc-v100"])
    undo = {}
    for cls in (Grubby, RpmOstree):

        class Loader(cls):  # type: ignore[valid-type,misc]
            def configured(self) -> list[str]:
                return before

        (run,) = Loader(HostRoot(path), discover(path)).actions(change)
        undo[cls.__name__] = list(run.undo_argv)
    assert undo["Grubby"] == [
        "grubby",
        "--update-kernel=ALL",
        "--remove-args=iommu=pt intel_iommu=on",
        "--args=iommu=soft amd_iommu=on",
    ]
    assert undo["RpmOstree"] == [
        "rpm-ostree",
        "kargs",
        "--replace=iommu=soft",
        "--delete-if-present=intel_iommu=on",
        "--append-if-missing=amd_iommu=on",
    ]


def test_discover_reads_through_the_callers_root(hosts: dict[str, Path]) -> None:
    """plan, bind, verify and the host module hand discover() the root reader they go on
    using: it reads through that one (a recorder sees the reads), the same host as from
    the path."""
    path = str(hosts["consumer-intel"])

    class Counting(HostRoot):
        reads = 0

        def read_bytes(self, rel: str, limit: int = MAX_FILE) -> bytes | None:
            self.reads += 1
            return super().read_bytes(rel, limit)

    root = Counting(path)
    assert discover(root) == discover(path) and root.reads > 0


def test_unknown_bootloader_refuses_and_prints_the_arguments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "consumer-intel", {"boot": {"bootloader": "none"}})
    before = tree_hash(path)
    assert main(["apply", "--root", str(path)]) == 2
    err = capsys.readouterr().err
    assert "cannot tell which bootloader" in err and "vfio-pci.ids=10de:2684,10de:22ba" in err
    assert tree_hash(path) == before


def test_a_machine_booted_without_a_bootloader_is_told_where_arguments_go(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A cloud GPU VM started by Firecracker (the lent device machine: /boot empty, no boot
    tools, rdinit= on the command line): not "your bootloader's tool" but what starts it."""
    path = build(tmp_path, "consumer-intel", {"boot": {"bootloader": "direct"}})
    before = tree_hash(path)
    assert main(["plan", "--root", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "no bootloader and no kernel image in /boot" in err, err
    assert "hypervisor's kernel command line" in err, err
    assert err.endswith("add them there: vfio-pci.ids=10de:2684,10de:22ba"), err
    assert len(err.splitlines()) == 1 and tree_hash(path) == before
    assert main(["check", "--root", str(path), "--json"]) == 0  # a WARN, not a failure
    boot = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}["bootloader"]
    assert boot["level"] == "WARN" and "no kernel image in /boot" in boot["summary"], boot
    assert "hypervisor's kernel command line" in boot["fix"], boot
    # a kernel image in /boot: some bootloader put it there, we only cannot tell which
    (path / "boot/vmlinuz-6.1.0-27-amd64").write_bytes(b"")
    assert main(["plan", "--root", str(path)]) == 2
    assert "cannot tell which bootloader" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('GRUB_CMDLINE_LINUX_DEFAULT="quiet"\r\n', "CRLF"),
        ('GRUB_CMDLINE_LINUX_DEFAULT="$(cat /etc/cmdline)"\n', "command substitution"),
    ],
)
def test_unparseable_grub_file_refuses(
    content: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "consumer-intel", {})
    (path / "etc/default/grub").write_text(content)
    before = tree_hash(path)
    assert main(["apply", "--root", str(path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "/etc/default/grub" in err
    assert tree_hash(path) == before


# -- composing with the admin's own boot configuration ----------------------------------


def _apply_plan(path: Path, opts: PlanOptions) -> Plan:
    root = HostRoot(str(path))
    plan, _ = make_plan(root, discover(str(path)), opts)
    apply(root, plan, plan.record())
    return plan


def test_grub_admin_edit_after_apply_takes_effect_with_ours(tmp_path: Path) -> None:
    path = build(tmp_path, "consumer-intel", {})
    grub = path / "etc/default/grub"
    grub.write_text(
        'GRUB_CMDLINE_LINUX="vfio-pci.ids=10ec:8168"\n'  # a NIC another VM gets: kept
        'GRUB_CMDLINE_LINUX_DEFAULT="quiet"\n'
    )
    plan = _apply_plan(path, PlanOptions())
    ids = "vfio-pci.ids=10de:2684,10de:22ba,10ec:8168"
    assert plan.kernel_args.set["vfio-pci.ids"] == ids
    assert "keeps 10ec:8168" in plan.kernel_args.why["vfio-pci.ids"]
    # moved into ours where the admin wrote it (one vfio-pci.ids= is read)
    assert grub.read_text().startswith('GRUB_CMDLINE_LINUX=""\n')
    assert grub_line(path, tmp_path) == ["quiet", "iommu=pt", ids]
    # the admin adds an argument later: it is in the next boot's line, and so are ours
    grub.write_text(grub.read_text().replace('"quiet"', '"quiet nomodeset"'))
    assert grub_line(path, tmp_path) == ["quiet", "nomodeset", "iommu=pt", ids]
    assert make_plan(HostRoot(str(path)), discover(str(path)), PlanOptions())[0].empty


@pytest.mark.parametrize("iommu_pt", [True, False])
def test_grub_iommu_off_goes_where_it_was_written(tmp_path: Path, iommu_pt: bool) -> None:
    """An admin's iommu=off beside iommu=pt: with iommu=pt planned, setting the key replaces
    the off (never a refusal naming our own drop-in); without it, the key is dropped (every
    value of it: removal goes by key)."""
    path = build(tmp_path, "consumer-intel", {})
    grub = path / "etc/default/grub"
    grub.write_text(
        'GRUB_CMDLINE_LINUX=""\nGRUB_CMDLINE_LINUX_DEFAULT="quiet iommu=pt iommu=off"\n'
    )
    plan = _apply_plan(path, PlanOptions(iommu_pt=iommu_pt))
    line = grub_line(path, tmp_path)
    assert "iommu=off" not in line and "iommu=off" not in grub.read_text()
    assert ("iommu=pt" in line) is iommu_pt, line
    assert ("iommu" in plan.kernel_args.drop) is not iommu_pt
    if iommu_pt:
        assert "replaces iommu=off" in plan.kernel_args.why["iommu"]


def test_grub_d_after_ours_that_appends_composes_and_one_that_replaces_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "consumer-intel", {})
    grub_d = path / "etc/default/grub.d"
    grub_d.mkdir(parents=True, exist_ok=True)
    (grub_d / "kdump-tools.cfg").write_text(
        'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT crashkernel=512M"\n'
    )
    _apply_plan(path, PlanOptions())
    line = grub_line(path, tmp_path)
    assert line[-1] == "crashkernel=512M" and "vfio-pci.ids=10de:2684,10de:22ba" in line
    other = build(tmp_path / "b", "consumer-intel", {})
    (other / "etc/default/grub.d").mkdir(parents=True, exist_ok=True)
    (other / "etc/default/grub.d/zz-harden.cfg").write_text('GRUB_CMDLINE_LINUX_DEFAULT="ro"\n')
    before = tree_hash(other)
    assert main(["apply", "--root", str(other)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "/etc/default/grub.d/zz-harden.cfg: sorts after" in err
    assert tree_hash(other) == before


def test_mkinitcpio_dropin_survives_a_user_dropin_without_final_newline(tmp_path: Path) -> None:
    path = build(tmp_path, "root-nvme-in-group", {})
    conf_d = path / "etc/mkinitcpio.conf.d"
    conf_d.mkdir()
    (conf_d / "hooks.conf").write_text("HOOKS=(base udev modconf block filesystems)")
    _apply_plan(path, PlanOptions(gpus=("0a:00.0",), allow_boot_gpu=True))
    ours = (conf_d / "passthrough-vfio.conf").read_text()
    assert "`" not in ours and "$(" not in ours
    combined = tmp_path / "combined"
    combined.write_bytes(
        b"".join(p.read_bytes() for p in [path / "etc/mkinitcpio.conf", *sorted(conf_d.iterdir())])
    )
    out = run_ok(
        ["env", "-i", "bash", "-c", f'. "{combined}"; echo "${{HOOKS[*]}}"; echo "${{MODULES[*]}}"']
    ).stdout.split("\n")
    assert out[0] == "base udev modconf block filesystems"
    assert out[1] == "vfio_pci vfio vfio_iommu_type1"


def test_mkinitcpio_string_form_is_edited_in_place(tmp_path: Path) -> None:
    path = build(tmp_path, "root-nvme-in-group", {})
    conf = path / "etc/mkinitcpio.conf"
    conf.write_text('MODULES="amdgpu"\nHOOKS=(base udev modconf)\n')
    _apply_plan(path, PlanOptions(gpus=("0a:00.0",), allow_boot_gpu=True))
    assert (
        conf.read_text()
        == 'MODULES="vfio_pci vfio vfio_iommu_type1 amdgpu"\nHOOKS=(base udev modconf)\n'
    )


def test_modprobe_conflicts_are_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = build(tmp_path, "consumer-intel", {})
    d = path / "etc/modprobe.d"
    (d / "nvme-vfio.conf").write_text("options vfio-pci ids=144d:a808\nblacklist vfio_pci\n")
    data = _plan(path, PlanOptions())
    conf = next(
        a for a in data["actions"] if a.get("path") == "/etc/modprobe.d/passthrough-vfio.conf"
    )
    assert "+options vfio-pci ids=10de:2684,10de:22ba,144d:a808" in conf["diff"]
    notes = "\n".join(data["notes"])
    assert (
        "/etc/modprobe.d/nvme-vfio.conf:1: its vfio-pci ids= is read before ours, ours wins"
        in notes
    )
    assert (
        "/etc/modprobe.d/nvme-vfio.conf:2: blacklist vfio_pci stops loading by alias only" in notes
    )
    # read after ours, without our IDs: it wins, so our IDs go into its line (journaled)
    (d / "vfio.conf").write_text("options vfio_pci ids=10ec:8168 disable_vga=1\n")
    data = _plan(path, PlanOptions())
    theirs = next(a for a in data["actions"] if a.get("path") == "/etc/modprobe.d/vfio.conf")
    assert "+options vfio_pci ids=10ec:8168,10de:2684,10de:22ba disable_vga=1" in theirs["diff"]
    assert any(
        "vfio.conf:1: its vfio-pci ids= is read after ours and wins" in n for n in data["notes"]
    )
    # what is not a PCI ID (a template's placeholder) is refused, nothing written
    (d / "vfio.conf").write_text("# generated\noptions vfio_pci ids=%DEVICES%\n")
    before = tree_hash(path)
    assert main(["apply", "--root", str(path)]) == 2
    err = capsys.readouterr().err
    assert "/etc/modprobe.d/vfio.conf:2: vfio-pci ids= has '%DEVICES%', which is no PCI ID" in err
    assert tree_hash(path) == before


@pytest.mark.parametrize("release", ["../../../tmp/x", "6.1.0 -x", ""])
def test_a_kernel_release_that_cannot_be_one_is_refused(
    release: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "root-nvme-in-group", {})
    (path / "proc/sys/kernel/osrelease").write_text(release + "\n")
    before = tree_hash(path)
    code = main(["apply", "--root", str(path), "--gpu", "0a:00.0", "--allow-boot-gpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "kernel release" in err, err
    assert tree_hash(path) == before


def test_dracut_file_after_ours_that_replaces_force_drivers_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = build(tmp_path, "two-gpus-one-group", {})
    (path / "etc/dracut.conf.d/90-mine.conf").write_text('force_drivers+=" nvme "\n')
    assert _plan(path, PlanOptions(gpus=("01:00.0", "02:00.0"), allow_boot_gpu=True))["actions"]
    (path / "etc/dracut.conf.d/zz-mine.conf").write_text('# mine\nforce_drivers="nvme"\n')
    before = tree_hash(path)
    args = ["--gpu", "01:00.0", "--gpu", "02:00.0", "--allow-boot-gpu"]
    assert main(["apply", "--root", str(path), *args]) == 2
    err = capsys.readouterr().err
    assert "/etc/dracut.conf.d/zz-mine.conf:2: sorts after 10-passthrough-vfio.conf" in err
    assert tree_hash(path) == before
