# SPDX-License-Identifier: Apache-2.0
"""The address planner (vm/layout.py): golden domains for large-BAR guests, each checked by
libvirt's schema, our validator and the real libvirtd's domxml-to-native; refusals with the
numbers; the planner's decisions for firmware and libvirt versions this machine lacks; and
``layout_findings`` on hand-written domains."""

from __future__ import annotations

import copy
import dataclasses
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lxml import etree

from passthrough import fakehost
from passthrough.analysis.policy import Refused
from passthrough.cli import main
from passthrough.host.discover import discover, group_functions
from passthrough.host.snapshot import unpack
from passthrough.model import Bar, Host, PciFunction
from passthrough.units import GIB, MIB, TIB
from passthrough.vm.layout import (
    LayoutRefused,
    MaxPhysAddr,
    card_bars,
    pack,
    plan_layout,
)
from passthrough.vm.layout_check import layout_findings
from passthrough.vm.render import render
from passthrough.vm.spec import VmOptions, build_spec
from passthrough.vm.validate import validate_text
from passthrough.vm.versions import DEFAULT_VERSIONS, Versions, read_versions

from .conftest import GOLDEN, assert_golden
from .test_vm import _native

# the real capture of an H100 guest (shared/fixtures/h100-guest), made by `passthrough snapshot`
H100_SNAPSHOT = Path(__file__).parent / "fixtures" / "h100-guest-snapshot.tar.gz"
# what the versions would be if read: the tests pin them so the goldens do not follow the machine
KNOWN_DEBIAN12 = Versions((9, 0), (7, 2), (2022, 11), "given")


def _walk(items: list[dict[str, Any]], addr: str) -> dict[str, Any]:
    for item in items:
        if item.get("addr") == addr:
            return item
        try:
            return _walk(item.get("children", []), addr)
        except KeyError:
            continue
    raise KeyError(addr)


def _variant(base: Path, sample: str, name: str, change: Callable[[dict[str, Any]], None]) -> Path:
    data = copy.deepcopy(fakehost.load(sample).data)
    change(data)
    return fakehost.build(fakehost.Description(data, f"{sample}+{name}"), base / name)


def _cpu_bits(bits: int) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["cpu"].update(phys_bits=bits)


def _iommu_bits(bits: int) -> Callable[[dict[str, Any]], None]:
    return lambda d: d.setdefault("iommu", {}).update(address_bits=bits)


def _rebar_off(d: dict[str, Any]) -> None:
    # Resizable BAR off: the RTX 4090 shows a 256 MiB BAR1 instead of 32 GiB
    _walk(d["pci"], "01:00.0")["bars"] = {0: "16M", 1: "256M p64", 3: "32M p64", 5: "io 128"}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("layout-hosts")
    capture = base / "h100-capture"
    capture.mkdir()
    return {
        "hgx": fakehost.build(fakehost.load("hgx-h100"), base / "hgx"),
        "consumer": fakehost.build(fakehost.load("consumer-intel"), base / "consumer"),
        "hgx-39": _variant(base, "hgx-h100", "hgx-39", _cpu_bits(39)),
        "hgx-iommu39": _variant(base, "hgx-h100", "hgx-iommu39", _iommu_bits(39)),
        "rebar-off": _variant(base, "consumer-intel", "rebar-off", _rebar_off),
        "h100-capture": Path(unpack(str(H100_SNAPSHOT), str(capture))),
    }


# case → (host, options): names carry this branch's prefix, unique on the shared libvirtd
CASES: dict[str, tuple[str, VmOptions]] = {
    "h100-real-capture": (
        "h100-capture",
        VmOptions(name="bp-h100-capture", gpus=("00:06.0",), vcpus=2, memory_mib=16384),
    ),
    "rtx4090-rebar-off": ("rebar-off", VmOptions(name="bp-rebar-off", memory_mib=16384)),
    # test_vm's 8-GPU golden asks for hugepages, which domxml-to-native needs mounted: not here
    "hgx-8xh100-layout": ("hgx", VmOptions(name="bp-hgx8", vcpus=16, memory_mib=262144)),
    "h100-on-39-bit-host": (
        "hgx-39",
        VmOptions(name="bp-h100-39bit", gpus=("18:00.0",), memory_mib=8192),
    ),
    "h100-iommu-narrower-than-cpu": (
        "hgx-iommu39",
        VmOptions(name="bp-h100-iommu39", gpus=("18:00.0",), memory_mib=8192),
    ),
}
# the QEMU argv each golden must produce through the real libvirtd (None: must be absent)
ARGV: dict[str, dict[str, str | None]] = {
    "h100-real-capture": {
        "cpu": "host-phys-bits=on",
        "fw_cfg": "name=opt/ovmf/X-PciMmio64Mb,string=262144",
        "hole": "q35-pcihost.pci-hole64-size=268435456K",
    },
    "rtx4090-rebar-off": {"cpu": "host-phys-bits=on", "fw_cfg": None, "hole": None},
    "h100-on-39-bit-host": {
        "cpu": "host-phys-bits=on",
        "fw_cfg": "name=opt/ovmf/X-PciMmio64Mb,string=262144",
        "hole": "q35-pcihost.pci-hole64-size=268435456K",
    },
    "h100-iommu-narrower-than-cpu": {
        "cpu": "phys-bits=39",
        "fw_cfg": "name=opt/ovmf/X-PciMmio64Mb,string=262144",
        "hole": "q35-pcihost.pci-hole64-size=268435456K",
    },
    # the existing goldens of test_vm.py: a 4090 with Resizable BAR on, 2 and 8 H100s
    "consumer-2fn": {
        "cpu": "host-phys-bits=on",
        "fw_cfg": "name=opt/ovmf/X-PciMmio64Mb,string=65536",
        "hole": "q35-pcihost.pci-hole64-size=67108864K",
    },
    "hgx-2xh100-node0": {
        "cpu": "host-phys-bits=on",
        "fw_cfg": "name=opt/ovmf/X-PciMmio64Mb,string=524288",
        "hole": "q35-pcihost.pci-hole64-size=536870912K",
    },
    "hgx-8xh100-layout": {
        "cpu": "host-phys-bits=on",
        "fw_cfg": "name=opt/ovmf/X-PciMmio64Mb,string=2097152",
        "hole": "q35-pcihost.pci-hole64-size=2147483648K",
    },
}
HOST_OF = {"consumer-2fn": "consumer", "hgx-2xh100-node0": "hgx"}


def _with_iommu_on(host: Host) -> Host:
    """The capture's own facts with each function in an IOMMU group of its own, as the same
    hardware reads on a host with its IOMMU on (a fact edit, named as such: the capture is
    a guest, which render refuses — no IOMMU — and the layout arithmetic on its real BARs is
    the point here)."""
    functions = [dataclasses.replace(f, iommu_group=n) for n, f in enumerate(host.functions)]
    return dataclasses.replace(host, functions=tuple(functions), groups=group_functions(functions))


def _host_of(case: str, roots: dict[str, Path]) -> Host:
    host = discover(str(roots[CASES[case][0]]))
    return _with_iommu_on(host) if case == "h100-real-capture" else host


@pytest.fixture(scope="module")
def rendered(roots: dict[str, Path]) -> dict[str, str]:
    return {
        case: render(build_spec(_host_of(case, roots), opts, DEFAULT_VERSIONS))
        for case, (_host, opts) in CASES.items()
    }


def test_render_refuses_the_capture_as_validate_does(roots: dict[str, Path]) -> None:
    """One verdict: the guest capture has no IOMMU; render refuses what validate rejects."""
    host = discover(str(roots["h100-capture"]))
    with pytest.raises(Refused) as exc:
        build_spec(host, CASES["h100-real-capture"][1], DEFAULT_VERSIONS)
    assert exc.value.codes == ("no-iommu",)


def _xml(case: str, rendered: dict[str, str]) -> str:
    if case in rendered:
        return rendered[case]
    return (GOLDEN / "vm" / f"{case}.xml").read_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_golden(case: str, rendered: dict[str, str], regenerate: bool) -> None:
    assert_golden(GOLDEN / "vm" / f"{case}.xml", rendered[case], regenerate, "render")


@pytest.mark.parametrize("case", sorted(ARGV))
def test_schema_and_our_validator_accept(
    case: str, rendered: dict[str, str], roots: dict[str, Path], tmp_path: Path
) -> None:
    xml = _xml(case, rendered)
    path = tmp_path / f"{case}.xml"
    path.write_text(xml)
    r = subprocess.run(["virt-xml-validate", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    host = discover(str(roots[HOST_OF.get(case) or CASES[case][0]]))
    # The capture is a guest (no IOMMU of its own): the safety policy says so; the layout
    # (the point here) has nothing to say on any case. Warnings are scan's for the cards.
    expected = ["no-iommu"] if case == "h100-real-capture" else []
    found = validate_text(xml.encode(), case, host)
    assert [f.code for f in found if str(f.severity) == "error"] == expected
    assert layout_findings(etree.fromstring(xml.encode()), host, DEFAULT_VERSIONS) == []


@pytest.mark.parametrize("case", sorted(ARGV))
def test_real_libvirtd_puts_the_planned_bits_and_window_in_the_argv(
    case: str,
    rendered: dict[str, str],
    libvirtd: str,
) -> None:
    xml = _xml(case, rendered)
    name = etree.fromstring(xml.encode()).findtext("name")
    if not str(name).startswith("bp-"):  # a test_vm golden: rename it for the shared daemon
        xml = xml.replace(f"<name>{name}</name>", f"<name>bp-{name}</name>", 1)
    argv = _native(libvirtd, xml, case)
    cpu = next(part for part in argv.split() if part.startswith(("host,", "max,")))
    want = ARGV[case]
    assert str(want["cpu"]) in cpu.split(","), cpu
    for key in ("fw_cfg", "hole"):
        if want[key] is None:
            assert "X-PciMmio64Mb" not in argv and "pci-hole64-size" not in argv
        else:
            assert str(want[key]) in argv.split(), (key, argv)


def test_rebar_off_has_no_window_element_and_rebar_on_has_one(rendered: dict[str, str]) -> None:
    off = rendered["rtx4090-rebar-off"]
    assert "pcihole64" not in off and "qemu:commandline" not in off and "xmlns:qemu" not in off
    on = (GOLDEN / "vm" / "consumer-2fn.xml").read_text()
    assert "<pcihole64 unit='KiB'>67108864</pcihole64>" in on  # 32 GiB + 32 MiB → 64 GiB


@pytest.mark.parametrize(
    ("hole", "starts"), [("268435456K", True), ("2147483648K", False)], ids=["fits", "too-big"]
)
def test_real_qemu_refuses_a_hole_past_the_guest_bits(hole: str, starts: bool) -> None:
    """QEMU itself (7.1+) checks RAM + the 64-bit PCI hole against phys-bits at start-up:
    the one-H100 plan on a 39-bit host starts; the eight-H100 window would not. TCG and no
    devices: only the address-space check runs, then the monitor quits."""
    argv = ["qemu-system-x86_64", "-machine", "q35,accel=tcg", "-cpu", "max,phys-bits=39"]
    argv += ["-global", f"q35-pcihost.pci-hole64-size={hole}", "-m", "8G", "-S"]
    argv += ["-display", "none", "-monitor", "stdio", "-nodefaults"]
    r = subprocess.run(argv, input="quit\n", capture_output=True, text=True, timeout=60)
    if starts:
        assert r.returncode == 0, r.stderr
    else:
        assert r.returncode != 0 and "phys-bits too low (39)" in r.stderr, r.stderr


def test_the_real_capture_and_the_hgx_sample_have_the_same_bars(roots: dict[str, Path]) -> None:
    capture = discover(str(roots["h100-capture"]))
    hgx = discover(str(roots["hgx"]))

    def bars(host: Host, address: str) -> list[tuple[int, int, bool, bool]]:
        fn = next(f for f in host.functions if str(f.address) == address)
        return [(b.index, b.size, b.is_64bit, b.prefetchable) for b in fn.bars]

    real = bars(capture, "0000:00:06.0")
    assert real == [
        (0, 16 * MIB, True, True),
        (2, 128 * GIB, True, True),
        (4, 32 * MIB, True, True),
    ]
    assert bars(hgx, "0000:18:00.0") == real
    assert capture.cpu.phys_bits == 46 and capture.iommu.address_bits is None  # a guest: no VT-d


def _h100s(host: Host, count: int) -> list[list[PciFunction]]:
    return [[f] for f in host.functions if f.device_id == 0x2330][:count]


def test_packing_eight_h100s(roots: dict[str, Path]) -> None:
    cards = [card_bars(fns) for fns in _h100s(discover(str(roots["hgx"])), 8)]
    need, alignment = pack(cards)
    # seven root-port windows on 256 GiB strides (128 GiB + 48 MiB, realigned), then the last
    assert (need, alignment) == (7 * 256 * GIB + 128 * GIB + 48 * MIB, 128 * GIB)


def test_eight_h100s_on_a_39_bit_host_are_refused_with_the_numbers(
    roots: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "never.xml"
    argv = ["render", "--root", str(roots["hgx-39"]), "--name", "bp-x", "--memory", "256G"]
    assert main([*argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    line = [e for e in err if e.startswith("passthrough: error:")]
    assert len(line) == 1, err
    assert "1920.05 GiB" in line[0] and "2^39 = 512 GiB" in line[0] and "39 bits" in line[0]
    assert not out.exists()


def test_one_h100_on_a_39_bit_host_fits_only_with_little_ram(roots: dict[str, Path]) -> None:
    host = discover(str(roots["hgx-39"]))
    fits = build_spec(host, CASES["h100-on-39-bit-host"][1], DEFAULT_VERSIONS).layout
    assert fits is not None and fits.guest_bits == 39 and fits.fwcfg_mib == 256 * 1024
    # RAM ends at 10 GiB → the 256 GiB aperture sits at 256 GiB and ends exactly at 2^39
    assert (fits.window.base, fits.window.end, fits.address_limit) == (
        256 * GIB,
        512 * GIB,
        512 * GIB,
    )
    big = VmOptions(name="bp-h100-39-big", gpus=("18:00.0",), memory_mib=300 * 1024)
    with pytest.raises(LayoutRefused) as refused:
        build_spec(host, big, DEFAULT_VERSIONS)
    assert "0x8000000000..0xc000000000" in str(refused.value)  # 512 GiB..768 GiB > 2^39


def test_iommu_narrower_than_the_cpu_lowers_the_guest_bits(roots: dict[str, Path]) -> None:
    host = discover(str(roots["hgx-iommu39"]))
    assert (host.cpu.phys_bits, host.iommu.address_bits) == (46, 39)
    one = _h100s(host, 1)
    kw: dict[str, Any] = dict(host_bits=46, iommu_bits=39, cpu_vendor="GenuineIntel")
    old = plan_layout(one, memory_mib=8192, versions=KNOWN_DEBIAN12, **kw)
    assert old.maxphysaddr == MaxPhysAddr("emulate", bits=39)  # libvirt 9.0: no limit attribute
    new = plan_layout(one, memory_mib=8192, versions=Versions((9, 3), (8, 0), (2023, 5)), **kw)
    assert new.maxphysaddr == MaxPhysAddr("passthrough", limit=39)
    # libvirt before 8.7 cannot lower the bits: QEMU's 40 exceed what the IOMMU maps
    with pytest.raises(LayoutRefused, match="IOMMU maps only 39 bits"):
        plan_layout(one, memory_mib=8192, versions=Versions((8, 0), (6, 2), (2022, 11)), **kw)


def test_ovmfs_own_window_suffices_when_the_versions_are_known(roots: dict[str, Path]) -> None:
    eight = _h100s(discover(str(roots["hgx"])), 8)
    kw: dict[str, Any] = dict(host_bits=46, iommu_bits=48, cpu_vendor="GenuineIntel")
    known = plan_layout(eight, memory_mib=262144, versions=KNOWN_DEBIAN12, **kw)
    # edk2 ≥ stable202211 trusts 46 bits: the top eighth, 8 TiB, holds 1.9 TiB of BARs
    assert known.fwcfg_mib is None and known.pcihole64_kib is None
    assert (known.window.how, known.window.size, known.window.end) == ("dynamic", 8 * TIB, 64 * TIB)
    older = plan_layout(
        eight, memory_mib=262144, versions=Versions((9, 0), (7, 2), (2022, 2)), **kw
    )
    assert older.fwcfg_mib == 2 * 1024 * 1024 and older.window.how == "classic"
    assumed = plan_layout(eight, memory_mib=262144, versions=DEFAULT_VERSIONS, **kw)
    assert assumed.fwcfg_mib == 2 * 1024 * 1024  # versions not read: not relied on


def test_an_emulated_cpu_gets_emulated_bits_and_untrusted_bits_get_32_gib(
    roots: dict[str, Path],
) -> None:
    one = _h100s(discover(str(roots["hgx"])), 1)
    tcg = plan_layout(
        one,
        host_bits=46,
        iommu_bits=48,
        cpu_vendor="GenuineIntel",
        memory_mib=8192,
        versions=KNOWN_DEBIAN12,
        virt_type="qemu",
    )
    assert tcg.maxphysaddr == MaxPhysAddr("emulate", bits=46)
    unknown = plan_layout(
        one, host_bits=None, iommu_bits=None, cpu_vendor="GenuineIntel", memory_mib=8192
    )
    # no host bits: QEMU's 40, which OVMF does not believe on Intel → classic window + X
    assert unknown.maxphysaddr is None and unknown.guest_bits == 40
    assert unknown.window.how == "classic" and unknown.fwcfg_mib == 256 * 1024


def test_render_json_and_text_explain_the_layout(
    roots: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    argv = ["render", "--root", str(roots["hgx"]), "--name", "bp-j", "--memory", "256G"]
    assert main([*argv, "--json"]) == 0
    layout = json.loads(capsys.readouterr().out)["layout"]
    assert layout["fwcfg_x_pcimmio64_mb"] == 2097152 and layout["guest_phys_bits"] == 46
    assert layout["maxphysaddr"] == {"mode": "passthrough"}
    assert layout["fwcfg_via"] == "qemu:commandline" and layout["decisions"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "note: layout: " in err and "X-PciMmio64Mb=2097152" in err


def test_versions_from_a_dpkg_database(tmp_path: Path) -> None:
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: libvirt-daemon\nStatus: install ok installed\nVersion: 9.0.0-4+deb12u2\n\n"
        "Package: qemu-system-x86\nStatus: install ok installed\n"
        "Version: 1:7.2+dfsg-7+deb12u18+b3\n\n"
        "Package: ovmf\nStatus: deinstall ok config-files\nVersion: 2020.11-2\n"
    )
    v = read_versions(str(tmp_path))
    assert (v.libvirt, v.qemu, v.ovmf) == ((9, 0), (7, 2), (2022, 11))
    assert v.assumed == ("ovmf",)  # only the removed package's version stands in
    assert "ovmf" in v.source  # removed package: its version is not believed


def test_versions_of_this_machine_match_dpkg_query() -> None:
    """The live root: the same versions dpkg-query reports (CI runs on Debian)."""
    v = read_versions("/")
    for what, package in (("libvirt", "libvirt-daemon"), ("qemu", "qemu-system-x86")):
        r = subprocess.run(
            ["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        major, minor = re.findall(r"\d+", r.stdout.split(":", 1)[-1])[:2]  # 1:7.2+dfsg-7 → 7, 2
        assert getattr(v, what) == (int(major), int(minor)), (what, r.stdout)
    assert v.source == "dpkg status" and not v.assumed


# -- layout_findings on hand-written domains ------------------------------------------------


def _hand_written(cpu_extra: str, x_mib: int | None) -> bytes:
    """The 8-H100 golden with its cpu bits and window replaced by hand."""
    xml = (GOLDEN / "vm" / "hgx-8xh100-two-numa.xml").read_text()
    xml = xml.replace("    <maxphysaddr mode='passthrough'/>\n", cpu_extra)
    if x_mib is not None:
        xml = xml.replace("string=2097152", f"string={x_mib}")
    return xml.encode()


def _codes(doc: bytes, host: Host) -> list[str]:
    return [f.code for f in layout_findings(etree.fromstring(doc), host, KNOWN_DEBIAN12)]


def test_findings_window_too_small_with_the_arithmetic(roots: dict[str, Path]) -> None:
    host = discover(str(roots["hgx"]))
    # QEMU's default 40 bits, which OVMF does not trust on Intel → only X-PciMmio64Mb counts
    doc = _hand_written("    <maxphysaddr mode='emulate' bits='40'/>\n", 32768)
    found = layout_findings(etree.fromstring(doc), host, KNOWN_DEBIAN12)
    assert [f.code for f in found] == ["mmio-window-too-small"]
    assert "1920.05 GiB" in found[0].message and "32 GiB" in found[0].message
    assert len(found[0].devices) == 8
    # the same X with the host's 46 bits (given, or QEMU's own for -cpu host under KVM):
    # OVMF's own 8 TiB window holds them
    assert _codes(_hand_written("    <maxphysaddr mode='passthrough'/>\n", 32768), host) == []
    assert _codes(_hand_written("", 32768), host) == []
    tcg = _hand_written("", 32768).replace(b"<domain type='kvm'", b"<domain type='qemu'")
    assert _codes(tcg, host) == ["mmio-window-too-small"]  # TCG: QEMU's 40 bits


def test_findings_window_above_the_limit_and_bits_above_the_iommu(
    roots: dict[str, Path],
) -> None:
    host = discover(str(roots["hgx"]))
    doc = _hand_written("    <maxphysaddr mode='emulate' bits='39'/>\n", None)
    assert _codes(doc, host) == ["mmio-window-above-limit"]
    narrow = discover(str(roots["hgx-iommu39"]))
    doc = (GOLDEN / "vm" / "hgx-8xh100-two-numa.xml").read_bytes()
    assert _codes(doc, narrow) == ["guest-bits-above-iommu"]


def test_a_window_is_never_sized_exactly_to_the_cards(roots: dict[str, Path]) -> None:
    """The lab's nested guest: a single 64 GiB BAR in a 64 GiB window found no space, because
    the domain's own virtio and USB devices take a share of the same aperture. The window
    leaves them room (the next power of two above the cards' 64 GiB is 128 GiB)."""
    h100 = _h100s(discover(str(roots["hgx"])), 1)[0][0]
    stand_in = dataclasses.replace(h100, bars=(Bar(2, 64 * GIB, False, True, True),))
    kw: dict[str, Any] = dict(host_bits=40, iommu_bits=39, cpu_vendor="AuthenticAMD")
    layout = plan_layout([[stand_in]], memory_mib=256, virt_type="qemu", **kw)
    assert layout.need == 64 * GIB and layout.fwcfg_mib == 128 * 1024
    assert (layout.window.base, layout.window.end) == (128 * GIB, 256 * GIB)


def test_which_versions_are_assumed() -> None:
    """The layout says when the OVMF it reasons about is the default standing in, and only
    then (the other tools' versions may be the ones missing)."""

    assert DEFAULT_VERSIONS.is_assumed("ovmf") and DEFAULT_VERSIONS.is_assumed("qemu")
    partly = Versions(
        (9, 0),
        (7, 2),
        (2022, 11),
        "dpkg status; not found on this root (Debian 12's versions stand in): libvirt",
        ("libvirt",),
    )
    assert partly.is_assumed("libvirt") and not partly.is_assumed("ovmf")
    assert not KNOWN_DEBIAN12.is_assumed("ovmf")
