# SPDX-License-Identifier: Apache-2.0
"""Guests a user can install: what `render` writes for a Windows 11 guest (TPM 2.0, Secure
Boot with enrolled keys, the installer and driver CD-ROMs, USB input, a console, one
socket), a Linux guest from an installer ISO, the emulator each root has, and the one
topology that libvirt and KubeVirt both get. The real-libvirt half is
tests/test_guest_install_libvirt.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from lxml import etree

from passthrough import fakehost
from passthrough.host.qemu import read_qemu
from passthrough.host.root import HostRoot
from tests.cli_process import run_cli

SAMPLES = fakehost.sample_names()


def render(root: Path | str, *args: str) -> etree._Element:
    r = run_cli(["render", "--root", str(root), "--name", "g", *args])
    assert r.returncode == 0, r.stderr
    return etree.fromstring(r.stdout.encode())


def one(dom: etree._Element, path: str) -> etree._Element:
    found = dom.findall(path)
    assert len(found) == 1, (path, etree.tostring(dom, encoding="unicode"))
    return found[0]


def features(dom: etree._Element) -> dict[str, str]:
    return {f.get("name"): f.get("enabled") for f in dom.findall("os/firmware/feature")}


def topology(dom: etree._Element) -> tuple[int, int, int]:
    t = one(dom, "cpu/topology")
    return int(t.get("sockets")), int(t.get("cores")), int(t.get("threads"))


@pytest.fixture()
def iso(tmp_path: Path) -> str:
    path = tmp_path / "win11.iso"
    path.write_bytes(b"")
    return str(path)


@pytest.mark.parametrize("name", SAMPLES)
def test_windows_guest_installs_on_every_sample_host(
    name: str, hosts: dict[str, Path], iso: str
) -> None:
    """Windows 11 Setup needs TPM 2.0 and Secure Boot, a disk it sees without a driver, a
    keyboard and a screen; the guest sees all its vCPUs on one socket."""
    dom = render(hosts[name], "--profile", "windows", "--vcpus", "4", "--cdrom", iso, "--no-gpu")
    tpm = one(dom, "devices/tpm")
    assert tpm.get("model") == "tpm-crb"
    assert one(tpm, "backend").attrib == {"type": "emulator", "version": "2.0"}
    assert one(dom, "os").get("firmware") == "efi"
    assert features(dom) == {"secure-boot": "yes", "enrolled-keys": "yes"}
    assert one(dom, "features/smm").get("state") == "on"
    cdrom = one(dom, "devices/disk[@device='cdrom']")
    assert one(cdrom, "source").get("file") == iso
    assert one(cdrom, "target").get("bus") == "sata"
    assert one(cdrom, "boot").get("order") == "1"
    assert dom.find("os/boot") is None  # per-device boot order: libvirt refuses both
    inputs = {(i.get("type"), i.get("bus")) for i in dom.findall("devices/input")}
    assert inputs == {("tablet", "usb"), ("keyboard", "usb")}
    assert one(dom, "devices/graphics").get("type") == "vnc"
    assert one(dom, "devices/graphics/listen").get("address") == "127.0.0.1"
    assert topology(dom) == (1, 4, 1)
    # the hiding is what it was: KVM hidden, a vendor_id, the enlightenments
    assert one(dom, "features/kvm/hidden").get("state") == "on"
    assert one(dom, "features/hyperv/vendor_id").get("value") == "passthrough"
    assert one(dom, "features/hyperv/vpindex").get("state") == "on"
    emulator = one(dom, "devices/emulator").text
    assert emulator == read_qemu(HostRoot(str(hosts[name]))).emulator


def test_windows_disk_is_sata_without_a_driver_iso_and_virtio_with_one(
    hosts: dict[str, Path], iso: str, tmp_path: Path
) -> None:
    disk = tmp_path / "win11.qcow2"
    disk.write_bytes(b"")
    drivers = tmp_path / "virtio-win.iso"
    drivers.write_bytes(b"")
    root = hosts["consumer-intel"]
    args = ("--profile", "windows", "--cdrom", iso, "--disk", str(disk))
    dom = render(root, *args)
    d = one(dom, "devices/disk[@device='disk']")
    assert one(d, "target").attrib == {"dev": "sda", "bus": "sata"}
    assert one(d, "boot").get("order") == "2"
    assert one(dom, "devices/disk[@device='cdrom']/target").get("dev") == "sdb"

    dom = render(root, *args, "--driver-iso", str(drivers))
    d = one(dom, "devices/disk[@device='disk']")
    assert one(d, "target").attrib == {"dev": "vda", "bus": "virtio"}
    cdroms = dom.findall("devices/disk[@device='cdrom']")
    assert [(one(c, "source").get("file"), one(c, "target").get("dev")) for c in cdroms] == [
        (iso, "sda"),
        (str(drivers), "sdb"),
    ]
    assert cdroms[1].find("boot") is None  # the driver disc is read by Setup, not booted
    # --disk-bus turns the SATA choice off
    dom = render(root, *args, "--disk-bus", "virtio")
    assert one(dom, "devices/disk[@device='disk']/target").get("bus") == "virtio"


def test_each_windows_piece_turns_off(hosts: dict[str, Path], tmp_path: Path) -> None:
    root = hosts["consumer-intel"]
    dom = render(
        root,
        "--profile",
        "windows",
        "--no-tpm",
        "--no-secure-boot",
        "--no-usb-input",
        "--headless",
        "--no-topology",
    )
    assert dom.find("devices/tpm") is None
    assert features(dom) == {"secure-boot": "no", "enrolled-keys": "no"}
    assert dom.find("features/smm") is None
    assert dom.find("devices/input") is None
    assert dom.find("devices/graphics") is None and dom.find("devices/video") is None
    assert dom.find("cpu/topology") is None
    # the console after installation: the serial one stays
    assert one(dom, "devices/serial/target").get("type") == "isa-serial"
    # the same from a spec file, and SPICE in place of VNC
    spec = tmp_path / "vm.yaml"
    spec.write_text("name: w\nprofile: windows\ntpm: false\nsecure_boot: false\ngraphics: spice\n")
    r = run_cli(["render", "--root", str(root), "--spec", str(spec)])
    dom = etree.fromstring(r.stdout.encode())
    assert dom.find("devices/tpm") is None and features(dom)["secure-boot"] == "no"
    assert one(dom, "devices/graphics").get("type") == "spice"


def test_headless_with_graphics_and_a_bad_graphics_are_refused_in_one_line(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = str(hosts["consumer-intel"])
    r = run_cli(["render", "--root", root, "--name", "w", "--headless", "--graphics", "vnc"])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "passthrough: error: headless: a headless guest has no graphics (leave out --graphics)"
    ]
    spec = tmp_path / "vm.yaml"
    spec.write_text("name: w\ngraphics: sdl\n")
    r = run_cli(["render", "--root", root, "--spec", str(spec)])
    assert r.returncode == 2 and "graphics: 'sdl' is not vnc or spice" in r.stderr
    r = run_cli(["render", "--root", root, "--name", "w", "--cdrom", str(tmp_path / "no.iso")])
    assert r.returncode == 2 and "cdrom:" in r.stderr and "does not exist" in r.stderr


def test_linux_guest_from_an_installer_iso(hosts: dict[str, Path], tmp_path: Path) -> None:
    iso = tmp_path / "debian.iso"
    iso.write_bytes(b"")
    dom = render(hosts["consumer-intel"], "--cdrom", str(iso), "--vcpus", "6")
    cdrom = one(dom, "devices/disk[@device='cdrom']")
    assert one(cdrom, "boot").get("order") == "1"
    assert one(dom, "devices/serial/target").get("type") == "isa-serial"
    assert one(dom, "devices/console/target").get("type") == "serial"
    assert dom.find("devices/graphics") is None and dom.find("devices/tpm") is None
    assert features(dom) == {"secure-boot": "no", "enrolled-keys": "no"}
    assert topology(dom) == (1, 6, 1)


def _tree(hosts: dict[str, Path], tmp_path: Path, name: str = "consumer-intel") -> Path:
    root = tmp_path / "root"
    shutil.copytree(hosts[name], root, symlinks=True)
    return root


def test_the_emulator_is_the_roots_own(hosts: dict[str, Path], tmp_path: Path) -> None:
    """RHEL, Rocky and Alma ship /usr/libexec/qemu-kvm only; a root with no QEMU at all is
    refused in one line (exit 2), nothing written."""
    assert one(render(hosts["epyc-v100"], "--no-gpu"), "devices/emulator").text == (
        "/usr/libexec/qemu-kvm"  # the sample host of the RHEL family
    )
    root = _tree(hosts, tmp_path)
    (root / "usr/bin/qemu-system-x86_64").unlink()
    (root / "usr/libexec").mkdir()
    (root / "usr/libexec/qemu-kvm").write_text("")
    assert one(render(root, "--no-gpu"), "devices/emulator").text == "/usr/libexec/qemu-kvm"
    (root / "usr/libexec/qemu-kvm").unlink()
    out = tmp_path / "g.xml"
    r = run_cli(["render", "--root", str(root), "--name", "g", "--no-gpu", "-o", str(out)])
    assert r.returncode == 2 and not out.exists()
    assert r.stderr.splitlines()[0].startswith("passthrough: error: no QEMU in this root")
    assert len([x for x in r.stderr.splitlines() if not x.startswith("note:")]) == 1


def test_a_snapshot_carries_the_emulator_and_firmware(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _tree(hosts, tmp_path)
    (root / "usr/bin/qemu-system-x86_64").unlink()
    (root / "usr/libexec").mkdir()
    (root / "usr/libexec/qemu-kvm").write_text("")
    snap = tmp_path / "snap.tar.gz"
    r = run_cli(["snapshot", "--root", str(root), "-o", str(snap)])
    assert r.returncode == 0, r.stderr
    shutil.rmtree(root)
    dom = render(snap, "--no-gpu", "--profile", "windows")
    assert one(dom, "devices/emulator").text == "/usr/libexec/qemu-kvm"
    # the descriptor came along: no warning that Secure Boot firmware is missing
    r = run_cli(["render", "--root", str(snap), "--name", "g", "--no-gpu", "--profile", "windows"])
    assert "Secure Boot" not in r.stderr


def test_topology_follows_the_hosts_smt_and_kubevirt_gets_the_same(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _tree(hosts, tmp_path)
    cpuinfo = (root / "proc/cpuinfo").read_text()
    (root / "proc/cpuinfo").write_text(
        cpuinfo.replace("processor\t:", "siblings\t: 16\ncpu cores\t: 8\nprocessor\t:")
    )
    assert topology(render(root, "--vcpus", "8", "--no-gpu")) == (1, 4, 2)
    assert topology(render(root, "--vcpus", "7", "--no-gpu")) == (1, 7, 1)  # odd: no threads
    r = run_cli(
        [
            "kubevirt",
            "render",
            "--root",
            str(root),
            "--name",
            "g",
            "--vcpus",
            "8",
            "--gpu",
            "01:00.0",
        ]
    )
    assert r.returncode == 0, r.stderr
    vm = next(d for d in yaml.safe_load_all(r.stdout) if d and d.get("kind") == "VirtualMachine")
    cpu = vm["spec"]["template"]["spec"]["domain"]["cpu"]
    assert (cpu["sockets"], cpu["cores"], cpu["threads"]) == (1, 4, 2)


def _smt_root(hosts: dict[str, Path], tmp_path: Path, siblings: bool = True) -> Path:
    """The HGX sample as a host with two threads a core, numbered as Linux numbers them: node
    0 holds CPUs 0-3 and their second threads 8-11 (cpu0 and cpu8 share a core)."""
    root = _tree(hosts, tmp_path, "hgx-h100")
    cpuinfo = (root / "proc/cpuinfo").read_text()
    (root / "proc/cpuinfo").write_text(
        cpuinfo.replace("processor\t:", "siblings\t: 16\ncpu cores\t: 8\nprocessor\t:")
    )
    (root / "sys/devices/system/node/node0/cpulist").write_text("0-3,8-11\n")
    for first in range(4) if siblings else ():
        for cpu in (first, first + 8):
            topo = root / f"sys/devices/system/cpu/cpu{cpu}/topology"
            topo.mkdir(parents=True)
            (topo / "thread_siblings_list").write_text(f"{first},{first + 8}\n")
    return root


def pins(dom: etree._Element) -> list[str]:
    return [p.get("cpuset") for p in dom.findall("cputune/vcpupin")]


def test_vcpu_pins_put_each_guest_core_on_one_host_core(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    """The guest is told vCPUs 0 and 1 are one core's threads: they are pinned to one host
    core's two threads (0 and 8), not to two cores (0 and 1); a snapshot carries the
    sibling lists; an odd vCPU count (no threads in the guest) keeps the node's order."""
    root = _smt_root(hosts, tmp_path)
    dom = render(root, "--vcpus", "4", "--gpu", "0000:18:00.0")
    assert topology(dom) == (1, 2, 2)
    assert pins(dom) == ["0", "8", "1", "9"]
    assert pins(render(root, "--vcpus", "3", "--gpu", "0000:18:00.0")) == ["0", "1", "2"]
    snap = tmp_path / "snap.tar.gz"
    assert run_cli(["snapshot", "--root", str(root), "-o", str(snap)]).returncode == 0
    assert pins(render(snap, "--vcpus", "4", "--gpu", "0000:18:00.0")) == ["0", "8", "1", "9"]


def test_vcpu_pins_without_sibling_lists_say_so(hosts: dict[str, Path], tmp_path: Path) -> None:
    root = _smt_root(hosts, tmp_path, siblings=False)
    r = run_cli(["render", "--root", str(root), "--name", "g", "--vcpus", "4", "--gpu", "18:00.0"])
    assert r.returncode == 0, r.stderr
    assert pins(etree.fromstring(r.stdout.encode())) == ["0", "1", "2", "3"]
    assert "vCPU pins are not aligned to cores" in r.stderr


def test_a_windows_guest_under_tcg_leaves_out_what_needs_kvm(hosts: dict[str, Path]) -> None:
    """QEMU sets VP_INDEX through KVM only: under TCG it will not start with it."""
    dom = render(hosts["consumer-intel"], "--profile", "windows", "--virt-type", "qemu")
    hyperv = {e.tag for e in one(dom, "features/hyperv")}
    assert not hyperv & {"vpindex", "synic", "stimer", "tlbflush", "ipi"}
    assert {"relaxed", "vapic", "spinlocks", "vendor_id"} <= hyperv


def test_kubevirt_gets_the_same_secure_boot_and_tpm(hosts: dict[str, Path]) -> None:
    def domain(*args: str) -> dict[str, object]:
        r = run_cli(
            [
                "kubevirt",
                "render",
                "--root",
                str(hosts["consumer-intel"]),
                "--name",
                "w",
                "--gpu",
                "01:00.0",
                "--profile",
                "windows",
                *args,
            ]
        )
        assert r.returncode == 0, r.stderr
        docs = [d for d in yaml.safe_load_all(r.stdout) if d]
        vm = next(d for d in docs if d.get("kind") == "VirtualMachine")
        return vm["spec"]["template"]["spec"]["domain"]  # type: ignore[no-any-return]

    win = domain()
    assert win["firmware"] == {"bootloader": {"efi": {"secureBoot": True}}}
    assert win["features"]["smm"] == {"enabled": True}  # type: ignore[index]
    assert win["devices"]["tpm"] == {}  # type: ignore[index]
    off = domain("--no-secure-boot", "--no-tpm")
    assert off["firmware"] == {"bootloader": {"efi": {"secureBoot": False}}}
    assert "smm" not in off["features"] and "tpm" not in off["devices"]  # type: ignore[operator]
