# SPDX-License-Identifier: Apache-2.0
"""The memlock estimate: the limit libvirt sets for a domain (libvirt 9.0's rule), the
libvirt daemons' units as discovery reads them, and ``memlock-short`` where the limits that
apply leave less than the VFIO devices pin (``validate --host-root``, ``render``).

The daemons' units are written into sample host trees here (the stock Debian 12 unit's
limits, and a drop-in that takes away CAP_SYS_RESOURCE): real files, read through the same
root reader as the live host."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from lxml import etree

from passthrough import fakehost
from passthrough.cli import main
from passthrough.host.discover import discover
from passthrough.units import GIB, MIB
from passthrough.vm.memlock import libvirt_limit

from .test_snapshot_parity import _parity

HOSTDEV = (
    "<hostdev mode='subsystem' type='pci' managed='yes'><source>"
    "<address domain='0x0000' bus='0x{bus:02x}' slot='0x00' function='0x0'/></source></hostdev>"
)

# Debian 12's /lib/systemd/system/libvirtd.service, the keys that matter (libvirt 9.0's
# src/remote/libvirtd.service.in: LimitMEMLOCK=64M for the eBPF device maps)
STOCK_UNIT = """[Unit]
Description=Virtualization daemon

[Service]
Type=notify
ExecStart=/usr/sbin/libvirtd $LIBVIRTD_ARGS
LimitNOFILE=8192
TasksMax=32768
LimitMEMLOCK=64M

[Install]
WantedBy=multi-user.target
"""
NO_SYS_RESOURCE = "[Service]\nCapabilityBoundingSet=~CAP_SYS_RESOURCE CAP_SYS_MODULE\n"


def domain(
    memory: str = "<memory unit='GiB'>16</memory>",
    devices: str = HOSTDEV.format(bus=1),
    extra: str = "",
    arch: str = "x86_64",
) -> str:
    return (
        f"<domain type='kvm'><name>m</name><uuid>{uuid.uuid4()}</uuid>{memory}{extra}"
        "<vcpu>2</vcpu>"
        f"<os><type arch='{arch}' machine='q35'>hvm</type></os>"
        f"<devices>{devices}</devices></domain>"
    )


def limit(xml: str) -> int | None:
    return libvirt_limit(etree.fromstring(xml)).limit


# -- libvirt's rule -----------------------------------------------------------------------


def test_vfio_guest_memory_plus_one_gib_whatever_the_number_of_devices() -> None:
    assert limit(domain()) == 17 * GIB
    two = HOSTDEV.format(bus=1) + HOSTDEV.format(bus=2)
    assert limit(domain(devices=two)) == 17 * GIB
    assert limit(domain(devices="")) == 0  # nothing pinned: libvirt sets nothing


def test_a_viommu_multiplies_by_the_vfio_devices() -> None:
    three = "".join(HOSTDEV.format(bus=b) for b in (1, 2, 3)) + "<iommu model='intel'/>"
    assert limit(domain(devices=three)) == 3 * 16 * GIB + GIB
    estimate = libvirt_limit(etree.fromstring(domain(devices=three)))
    assert estimate.why == "16 GiB guest memory × 3 (3 VFIO device(s) behind a vIOMMU) + 1 GiB"


def test_mdev_nvme_and_vdpa_count_as_libvirt_counts_them() -> None:
    mdev = (
        "<hostdev mode='subsystem' type='mdev' model='vfio-pci'><source>"
        "<address uuid='c2177883-f1bb-47f0-914d-32a22e3a8804'/></source></hostdev>"
    )
    nvme = (
        "<disk type='nvme' device='disk'><driver name='qemu' type='raw'/>"
        "<source type='pci' managed='yes' namespace='1'><address domain='0x0000' bus='0x05' "
        "slot='0x00' function='0x0'/></source><target dev='vda' bus='virtio'/></disk>"
    )
    vdpa = "<interface type='vdpa'><source dev='/dev/vhost-vdpa-0'/></interface>"
    iommu = "<iommu model='intel'/>"
    assert limit(domain(devices=mdev)) == 17 * GIB
    assert limit(domain(devices=nvme)) == 17 * GIB
    # vDPA: one more guest memory per interface, on top of the VFIO devices' one
    assert limit(domain(devices=vdpa + vdpa)) == 2 * 16 * GIB + GIB
    assert limit(domain(devices=mdev + nvme + vdpa)) == 2 * 16 * GIB + GIB
    assert limit(domain(devices=mdev + nvme + vdpa + iommu)) == 3 * 16 * GIB + GIB


def test_an_sriov_interface_is_a_hostdev_and_an_emulated_one_is_not() -> None:
    vf = (
        "<interface type='hostdev' managed='yes'><source><address type='pci' domain='0x0000' "
        "bus='0x03' slot='0x10' function='0x1'/></source></interface>"
    )
    assert limit(domain(devices=vf)) == 17 * GIB
    assert (
        limit(domain(devices="<interface type='network'><source network='default'/></interface>"))
        == 0
    )


def test_hard_limit_wins_and_locked_means_unlimited() -> None:
    hard = "<memtune><hard_limit unit='GiB'>8</hard_limit></memtune>"
    locked = "<memoryBacking><locked/></memoryBacking>"
    assert limit(domain(extra=hard)) == 8 * GIB
    assert limit(domain(extra=hard + locked)) == 8 * GIB
    assert limit(domain(extra=locked)) is None
    # VIR_DOMAIN_MEMORY_PARAM_UNLIMITED (KiB) is libvirt's "not set"
    unset = "<memtune><hard_limit unit='KiB'>9007199254740991</hard_limit></memtune>"
    assert limit(domain(extra=unset)) == 17 * GIB


def test_guest_memory_is_libvirts_total_memory() -> None:
    # decimal units are decimal, as in libvirt
    assert limit(domain(memory="<memory unit='GB'>16</memory>")) == 16 * 10**9 + GIB
    # no <memory>: the NUMA cells plus the memory devices (libvirt's post-parse)
    numa = (
        "<cpu><numa><cell id='0' cpus='0' memory='4' unit='GiB'/>"
        "<cell id='1' cpus='1' memory='4194304'/></numa></cpu>"
    )
    dimm = "<memory model='dimm'><target><size unit='GiB'>2</size><node>0</node></target></memory>"
    assert limit(domain(memory="", extra=numa, devices=HOSTDEV.format(bus=1) + dimm)) == 11 * GIB
    # maxMemory is the hotplug ceiling; the x86 rule counts what the guest has
    hotplug = "<maxMemory slots='4' unit='GiB'>64</maxMemory>"
    assert limit(domain(extra=hotplug)) == 17 * GIB


def test_pseries_counts_the_host_bridges_and_each_isolated_group() -> None:
    # 1 GiB, one default PHB plus one for the hostdev's group: 8 MiB + 8 MiB + 8 MiB base,
    # and the DMA windows max(2 GiB x 2, ...) (libvirt's pseries-hostdev case)
    xml = domain(memory="<memory unit='GiB'>1</memory>", arch="ppc64")
    assert limit(xml) == (24 * MIB) + 4 * GIB
    assert limit(domain(memory="<memory unit='GiB'>1</memory>", arch="ppc64", devices="")) == (
        20 * MIB
    )


# -- the daemons' units -------------------------------------------------------------------


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    return fakehost.build(fakehost.load("consumer-intel"), tmp_path / "root")


def capped(root: Path) -> Path:
    write(root, "lib/systemd/system/libvirtd.service", STOCK_UNIT)
    write(root, "etc/systemd/system/libvirtd.service.d/harden.conf", NO_SYS_RESOURCE)
    # enabled through its socket, as Debian 12 does it; the socket's unit file is not in
    # the tree (a link whose target discovery never reads, as in a snapshot)
    (root / "etc/systemd/system/sockets.target.wants").mkdir(parents=True, exist_ok=True)
    (root / "etc/systemd/system/sockets.target.wants/libvirtd.socket").symlink_to(
        "/lib/systemd/system/libvirtd.socket"
    )
    return root


def test_the_stock_unit_is_read_and_may_raise_the_limit(host_root: Path) -> None:
    assert discover(str(host_root)).libvirt_daemons == ()
    write(host_root, "lib/systemd/system/libvirtd.service", STOCK_UNIT)
    (daemon,) = discover(str(host_root)).libvirt_daemons
    assert (daemon.unit, daemon.path) == (
        "libvirtd.service",
        "/lib/systemd/system/libvirtd.service",
    )
    assert (daemon.memlock, daemon.memlock_text) == (64 * MIB, "64M")
    assert daemon.can_raise and not daemon.enabled


def test_drop_ins_apply_in_order_and_etc_hides_the_same_name(host_root: Path) -> None:
    capped(host_root)
    write(host_root, "usr/lib/systemd/system/virtqemud.service", STOCK_UNIT)
    write(
        host_root,
        "etc/systemd/system/libvirtd.service.d/zz-limit.conf",
        "[Service]\nLimitMEMLOCK=1G:2G\n",
    )
    # the same name in /run is hidden by /etc's; its User= never applies
    write(host_root, "run/systemd/system/libvirtd.service.d/harden.conf", "[Service]\nUser=x\n")
    by_unit = {d.unit: d for d in discover(str(host_root)).libvirt_daemons}
    libvirtd, virtqemud = by_unit["libvirtd.service"], by_unit["virtqemud.service"]
    assert libvirtd.memlock == 2 * GIB and libvirtd.memlock_text == "1G:2G"
    # the file the winning line is in: what a message must name for the admin to edit
    assert libvirtd.memlock_from == "/etc/systemd/system/libvirtd.service.d/zz-limit.conf"
    assert libvirtd.path == "/lib/systemd/system/libvirtd.service"
    assert not libvirtd.can_raise and "CAP_SYS_RESOURCE" in libvirtd.why_capped
    assert libvirtd.enabled and not virtqemud.enabled and virtqemud.can_raise
    # service.d/ drop-ins apply to every service
    write(
        host_root, "usr/lib/systemd/system/service.d/10-all.conf", "[Service]\nLimitMEMLOCK=128M\n"
    )
    by_unit = {d.unit: d for d in discover(str(host_root)).libvirt_daemons}
    assert by_unit["virtqemud.service"].memlock == 128 * MIB
    assert by_unit["libvirtd.service"].memlock == 2 * GIB  # zz-limit.conf sorts later
    write(
        host_root,
        "etc/systemd/system/libvirtd.service.d/zz-limit.conf",
        "[Service]\nLimitMEMLOCK=infinity\n",
    )
    by_unit = {d.unit: d for d in discover(str(host_root)).libvirt_daemons}
    assert by_unit["libvirtd.service"].memlock is None
    # a User= other than root cannot raise a hard limit either; an empty value resets
    write(
        host_root,
        "etc/systemd/system/libvirtd.service.d/zz-limit.conf",
        "[Service]\nCapabilityBoundingSet=\nUser=libvirt\n",
    )
    (d,) = [d for d in discover(str(host_root)).libvirt_daemons if d.unit == "libvirtd.service"]
    assert d.why_capped == "as User=libvirt" and d.memlock == 128 * MIB  # 10-all.conf


def test_a_masked_unit_is_not_a_daemon(host_root: Path) -> None:
    write(host_root, "lib/systemd/system/libvirtd.service", STOCK_UNIT)
    (host_root / "etc/systemd/system").mkdir(parents=True, exist_ok=True)
    (host_root / "etc/systemd/system/libvirtd.service").symlink_to("/dev/null")
    assert discover(str(host_root)).libvirt_daemons == ()


# -- validate --host-root and render ------------------------------------------------------


def validate(
    tmp_path: Path, xml: str, *argv: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, list[dict[str, object]]]:
    path = tmp_path / "d.xml"
    path.write_text(xml)
    rc = main(["validate", "--json", "--select", "memlock", *argv, str(path)])
    return rc, json.loads(capsys.readouterr().out)["files"][0]["findings"]


def test_validate_tells_a_hard_limit_below_the_need_with_the_arithmetic(
    host_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hard = "<memtune><hard_limit unit='GiB'>8</hard_limit></memtune>"
    rc, found = validate(tmp_path, domain(extra=hard), "--host-root", str(host_root), capsys=capsys)
    assert rc == 0 and [f["code"] for f in found] == ["memlock-short"]
    assert found[0]["severity"] == "warning" and found[0]["xpath"] == "/domain/memtune/hard_limit"
    assert found[0]["message"] == (
        "<memtune><hard_limit> 8 GiB is the QEMU process's locked-memory limit: 9 GiB short of "
        "17 GiB needed (16 GiB guest memory × 1 + 1 GiB, libvirt's rule); raise hard_limit or "
        "remove it"
    )
    rc, _ = validate(
        tmp_path, domain(extra=hard), "--host-root", str(host_root), "--strict", capsys=capsys
    )
    assert rc == 1
    # enough: 20 GiB; and no VFIO device at all
    enough = "<memtune><hard_limit unit='GiB'>20</hard_limit></memtune>"
    for xml in (domain(extra=enough), domain(extra=hard, devices="")):
        rc, found = validate(tmp_path, xml, "--host-root", str(host_root), capsys=capsys)
        assert (rc, found) == (0, [])


def test_validate_tells_a_daemon_that_cannot_raise_its_limit(
    host_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(host_root, "lib/systemd/system/libvirtd.service", STOCK_UNIT)
    # the stock unit: root with CAP_SYS_RESOURCE, libvirt raises QEMU's limit past 64M
    rc, found = validate(tmp_path, domain(), "--host-root", str(host_root), capsys=capsys)
    assert (rc, found) == (0, [])
    capped(host_root)
    rc, found = validate(tmp_path, domain(), "--host-root", str(host_root), capsys=capsys)
    # libvirt's prlimit would fail: the guest does not start, an error without --strict
    assert rc == 1 and [f["code"] for f in found] == ["memlock-capped"]
    assert found[0]["severity"] == "error" and found[0]["xpath"] == "/domain/devices"
    message = str(found[0]["message"])
    assert message.startswith(
        "libvirtd.service runs without CAP_SYS_RESOURCE (CapabilityBoundingSet), so it cannot "
        "raise QEMU's locked-memory limit above its LimitMEMLOCK=64M (0.06 GiB, "
        "/lib/systemd/system/libvirtd.service) to 17 GiB, 16.94 GiB short"
    ), message
    # <locked/>: libvirt asks for no limit at all, which the capped daemon cannot give
    locked = "<memoryBacking><locked/></memoryBacking>"
    _, found = validate(
        tmp_path, domain(extra=locked), "--host-root", str(host_root), capsys=capsys
    )
    assert "to no limit (<locked/>)" in str(found[0]["message"])
    # no finite limit serves <locked/>: the fix it names is infinity
    assert "set LimitMEMLOCK=infinity in a drop-in" in str(found[0]["message"])
    _, found = validate(
        tmp_path,
        domain(),
        "--host-root",
        str(host_root),
        "--ignore",
        "memlock-capped",
        capsys=capsys,
    )
    assert found == []
    # the enabled daemon is the one whose limits apply: here virtqemud, a stock unit
    (host_root / "etc/systemd/system/sockets.target.wants/libvirtd.socket").unlink()
    write(host_root, "lib/systemd/system/virtqemud.service", STOCK_UNIT)
    (host_root / "etc/systemd/system/sockets.target.wants/virtqemud.socket").symlink_to(
        "/lib/systemd/system/virtqemud.socket"
    )
    rc, found = validate(tmp_path, domain(), "--host-root", str(host_root), capsys=capsys)
    assert (rc, found) == (0, [])


def test_list_rules_has_memlock_short(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--list-rules", "--json"]) == 0
    listed = {r["code"]: r for r in json.loads(capsys.readouterr().out)["rules"]}
    assert listed["memlock-short"]["layer"] == "host"
    assert listed["memlock-short"]["severity"] == "warning"
    assert listed["memlock-capped"]["layer"] == "host"
    assert listed["memlock-capped"]["severity"] == "error"


def test_render_refuses_as_validate_does_and_snapshots_agree(
    host_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A capped daemon: render refuses in one line (exit 2, nothing written) with the same
    message validate gives the domain render writes once the daemon is fixed."""
    argv = ["render", "--root", str(host_root), "--name", "g", "--memory", "16G"]
    out = tmp_path / "g.xml"
    assert main([*argv, "-o", str(out)]) == 0
    assert "memlock-" not in capsys.readouterr().err
    capped(host_root)
    out.unlink()
    assert main([*argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.rstrip().endswith("[memlock-capped]"), err
    assert "to 17 GiB, 16.94 GiB short (17 GiB needed (16 GiB guest memory × 1 + 1 GiB" in err
    assert not out.exists()
    # the same card in a 16 GiB domain, validated against the capped host: the same words
    rc, found = validate(tmp_path, domain(), "--host-root", str(host_root), capsys=capsys)
    assert rc == 1 and [f["code"] for f in found] == ["memlock-capped"]
    assert f"{found[0]['message']} [memlock-capped]" in err
    # a snapshot carries the units: every command answers the same on it
    assert _parity("capped", host_root, tmp_path, capsys) >= 11


def test_sizes_beyond_what_libvirt_or_systemd_read_are_no_sizes(host_root: Path) -> None:
    # 5000 digits: Python's int() refuses it; libvirt reads 64 bits. No crash, no size.
    huge = "9" * 5000
    assert limit(domain(memory=f"<memory>{huge}</memory>")) == GIB
    write(host_root, "lib/systemd/system/libvirtd.service", f"[Service]\nLimitMEMLOCK={huge}\n")
    (daemon,) = discover(str(host_root)).libvirt_daemons
    assert daemon.memlock is None and daemon.memlock_text == huge
