# SPDX-License-Identifier: Apache-2.0
"""The safety policy, by its codes: what a card is, what plan/render refuse, and that no plan
ever hands a host device outside the card to vfio-pci.

Real trees only: every bundled sample host built by fakehost, and a real snapshot taken on
an H100 passthrough guest (tests/fixtures/h100-guest-snapshot.tar.gz, copied from the shared
fixtures), unpacked by the project's own snapshot code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from lxml import etree

from passthrough import fakehost
from passthrough.actions import Action, WriteFile
from passthrough.analysis import policy
from passthrough.analysis.cards import NoSuchCard
from passthrough.analysis.codes import POLICY
from passthrough.boot.families import UnknownBootloader
from passthrough.boot.nixos import NixosRefused
from passthrough.cli import main
from passthrough.host.discover import discover
from passthrough.host.root import HostRoot
from passthrough.host.snapshot import unpack
from passthrough.kargs import ArgChange
from passthrough.model import Host, PciAddress, Severity
from passthrough.plan import vfio
from passthrough.plan.build import PlanOptions, make_plan
from passthrough.plan.select import SelectionRefused, select

from .conftest import tree_hash

SNAPSHOT = Path(__file__).parent / "fixtures" / "h100-guest-snapshot.tar.gz"


def _a(text: str) -> PciAddress:
    return PciAddress.parse(text)


def _codes(host: Host, *addresses: str, allow_boot_gpu: bool = False) -> dict[str, Severity]:
    found = policy.selection_findings(host, [_a(a) for a in addresses], allow_boot_gpu)
    return {f.code: f.severity for f in found}


@pytest.fixture(scope="module")
def snapshot_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(unpack(str(SNAPSHOT), str(tmp_path_factory.mktemp("h100-guest"))))


# -- the card ------------------------------------------------------------------------------


def test_apu_card_is_the_igpu_and_its_audio_never_the_cpus_usb(hosts: dict[str, Path]) -> None:
    host = discover(str(hosts["amd-apu-desktop"]))
    gpus = {str(v.gpu.address): v for v in policy.judge_all(host)}
    apu = gpus["0000:30:00.0"]
    assert [str(f.address) for f in apu.gpu.functions] == ["0000:30:00.0", "0000:30:00.1"]
    assert apu.gpu.vfio_ids == ("1002:1638", "1002:1637")
    assert apu.viable and "boot-gpu" in apu.codes
    # the PSP, both USB controllers and the CPU's audio share the slot, not the card
    for other in ("30:00.2", "30:00.3", "30:00.4", "30:00.6"):
        assert all(f.address != _a(other) for v in gpus.values() for f in v.gpu.functions)
    assert gpus["0000:01:00.0"].viable and not gpus["0000:01:00.0"].findings


def test_apu_plan_binds_only_the_card(tmp_path: Path) -> None:
    root = fakehost.build(fakehost.load("amd-apu-desktop"), tmp_path / "root")
    plan, sel = make_plan(
        HostRoot(str(root)),
        discover(str(root)),
        PlanOptions(gpus=("30:00.0",), allow_boot_gpu=True),
    )
    assert sel.vfio_ids == ["1002:1638", "1002:1637"] and not sel.ids_ambiguous
    assert plan.target_args.set["vfio-pci.ids"] == "vfio-pci.ids=1002:1638,1002:1637"
    assert plan.target_args.set["initcall_blacklist"] == "initcall_blacklist=sysfb_init"
    assert _bound(discover(str(root)), plan.actions, plan.target_args) == {
        _a("30:00.0"),
        _a("30:00.1"),
    }


def test_arc_audio_behind_the_cards_switch_belongs_to_the_card(hosts: dict[str, Path]) -> None:
    host = discover(str(hosts["intel-arc-a770"]))
    arc = next(v for v in policy.judge_all(host) if v.gpu.address == _a("03:00.0"))
    assert [str(f.address) for f in arc.gpu.functions] == ["0000:03:00.0", "0000:04:00.0"]
    assert arc.viable and not arc.findings
    # the switch ports are group members, never card functions
    assert {_a("01:00.0"), _a("02:01.0"), _a("02:04.0")} <= set(arc.group_members)
    sel = select(host, policy.judge_all(host), ["03:00.0"])
    assert sel.vfio_ids == ["8086:56a0", "8086:4f90"]


def test_arc_audio_in_another_group_is_not_taken(tmp_path: Path) -> None:
    """Same layout, but the audio's downstream port has its own group: then it is no
    companion, and the card is the GPU alone."""
    desc = fakehost.load("intel-arc-a770")
    data = json.loads(json.dumps(desc.data))
    switch = data["pci"][1]["children"][0]
    switch["children"][1]["group"] = 30
    switch["children"][1]["group_children"] = True
    root = fakehost.build(fakehost.Description(data, "arc-split"), tmp_path / "root")
    host = discover(str(root))
    arc = next(v for v in policy.judge_all(host) if v.gpu.address == _a("03:00.0"))
    assert [str(f.address) for f in arc.gpu.functions] == ["0000:03:00.0"]
    assert arc.viable


def test_turing_card_has_four_functions(hosts: dict[str, Path]) -> None:
    host = discover(str(hosts["turing-desktop"]))
    rtx = next(v for v in policy.judge_all(host) if v.gpu.address == _a("01:00.0"))
    assert [f.address.function for f in rtx.gpu.functions] == [0, 1, 2, 3]
    assert rtx.gpu.vfio_ids == ("10de:1e87", "10de:10f8", "10de:1ad8", "10de:1ad9")
    assert rtx.viable
    sel = select(host, policy.judge_all(host), [])  # the default: every viable NVIDIA GPU
    assert [str(f.address) for f in sel.functions] == [
        "0000:01:00.0",
        "0000:01:00.1",
        "0000:01:00.2",
        "0000:01:00.3",
    ]


# -- selection_findings ----------------------------------------------------------------------


def test_selection_findings_codes(hosts: dict[str, Path]) -> None:
    b550 = discover(str(hosts["amd-b550-chipset"]))
    assert _codes(b550, "2a:00.0")["route-nic-in-group"] is Severity.ERROR
    assert _codes(b550, "21:08.0")["bridge-selected"] is Severity.ERROR
    assert set(_codes(b550, "2b:00.0", "2b:00.1")) == {"group-shared", "route-nic-in-group"}
    assert _codes(b550, "2d:00.0", "2d:00.1") == {"boot-gpu": Severity.ERROR}
    assert _codes(b550, "7f:00.0") == {"unknown-device": Severity.ERROR}
    nvme = discover(str(hosts["root-nvme-in-group"]))
    assert _codes(nvme, "04:00.0")["root-disk-in-group"] is Severity.ERROR
    bmc = discover(str(hosts["bmc-only-server"]))
    assert "bmc-vga" in _codes(bmc, "03:00.0", allow_boot_gpu=True)
    intel = discover(str(hosts["consumer-intel"]))
    assert _codes(intel, "00:02.0") == {"boot-gpu": Severity.ERROR}
    assert _codes(intel, "00:02.0", allow_boot_gpu=True) == {"boot-gpu": Severity.WARNING}
    assert _codes(intel, "01:00.0") == {"group-shared": Severity.ERROR}  # its audio left behind
    two = discover(str(hosts["two-gpus-one-group"]))
    assert set(_codes(two, "02:00.0", "02:00.1", "02:00.2", "02:00.3")) == {"group-other-gpu"}
    off = discover(str(hosts["iommu-off"]))
    assert _codes(off, "01:00.0", allow_boot_gpu=True) == {
        "no-iommu": Severity.ERROR,
        "boot-gpu": Severity.WARNING,
    }
    apu = discover(str(hosts["amd-apu-desktop"]))
    assert _codes(apu, "30:00.3") == {}  # a USB controller alone in its group may go


def test_every_code_is_documented() -> None:
    readme = (Path(__file__).parents[1] / "docs" / "discovery.md").read_text()
    for code, entry in POLICY.items():
        if entry.layer == "policy":
            assert f"`{code}`" in readme, code


def _emitted_codes() -> dict[str, set[str]]:
    """Every code a layer of the package puts in a ``Finding`` (or the policy's helpers),
    read from the source: a string, or a name bound to one in that module or in codes.py.
    ``kube/check.py`` is left out: its ``kube-*`` codes are ``kubevirt validate``'s own
    report on manifests, not the policy's (they never reach plan, render or validate)."""
    import ast

    from passthrough.analysis import codes

    package = Path(__file__).parents[1] / "passthrough"
    found: dict[str, set[str]] = {}
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).as_posix() == "kube/check.py":
            continue
        tree = ast.parse(path.read_text())
        local = {
            t.id: n.value.value
            for n in ast.walk(tree)
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name) and isinstance(n.value.value, str)
        }
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and call.args):
                continue
            func = call.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if name not in {"Finding", "_finding", "warn"}:
                continue
            arg = call.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                code = arg.value
            elif isinstance(arg, ast.Name) and (arg.id in local or hasattr(codes, arg.id)):
                code = local.get(arg.id) or getattr(codes, arg.id)
            elif isinstance(arg, ast.Attribute) and hasattr(codes, arg.attr):
                code = getattr(codes, arg.attr)
            else:
                continue  # a variable: the code was named where it was bound
            found.setdefault(code, set()).add(path.relative_to(package).as_posix())
    return found


def test_every_code_a_layer_emits_is_in_the_policy_table(
    hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """One table decides: every code the policy, the address check and kubevirt put in a
    finding has an entry (severity, host harm, override), and validate lists each of them
    (``unknown-device`` as ``host-missing``, which says it on every hostdev)."""
    emitted = _emitted_codes()
    assert {"bmc-vga", "boot-gpu", "large-bar", "mmio-window-too-small"} <= set(emitted)
    assert {c: where for c, where in emitted.items() if c not in POLICY} == {}
    # and at run time: every verdict on every sample host
    for name, root in hosts.items():
        for v in policy.judge_all(discover(str(root))):
            assert {f.code for f in v.findings} <= set(POLICY), name
    assert main(["validate", "--list-rules", "--json"]) == 0
    listed = {r["code"]: r["severity"] for r in json.loads(capsys.readouterr().out)["rules"]}
    assert set(POLICY) - {"unknown-device"} <= set(listed) and "host-missing" in listed
    for code, entry in POLICY.items():
        assert entry.severity in {"error", "warning", "info"}
        assert not (entry.harms_host and entry.override), code
        if code in listed:  # a boot VGA is told there: validate cannot know the host's flags
            want = "warning" if entry.override == "--allow-boot-gpu" else entry.severity
            assert listed[code] == want, code


def test_the_table_decides_what_blocks() -> None:
    from passthrough.analysis import codes
    from passthrough.model import Finding

    assert codes.blocks("boot-gpu") and not codes.blocks("boot-gpu", {"--allow-boot-gpu"})
    assert codes.severity("boot-gpu", {"--allow-boot-gpu"}) == "warning"
    assert codes.blocks("no-iommu") and not codes.blocks("no-iommu", {codes.PLAN})
    # what harms the host no flag lifts
    every = {"--allow-boot-gpu", "--include-group", codes.PLAN}
    harm = [c for c, e in POLICY.items() if e.harms_host]
    assert set(harm) == {
        "bmc-vga",
        "root-disk-in-group",
        "route-nic-in-group",
        "bridge-selected",
        "unknown-device",
    }
    assert all(codes.blocks(c, every) for c in harm)
    assert not codes.blocks("large-bar") and codes.severity("vfio-bound") == "info"
    found = [Finding(c, Severity.ERROR, c) for c in ("group-shared", "boot-gpu", "large-bar")]
    assert [f.code for f in codes.refusals(found)] == ["group-shared", "boot-gpu"]
    assert [f.code for f in codes.refusals(found, {"--allow-boot-gpu"})] == ["group-shared"]
    assert codes.lifted_by(codes.refusals(found)) == {"--include-group", "--allow-boot-gpu"}
    with pytest.raises(AttributeError):
        POLICY["boot-gpu"].severity = "info"  # type: ignore[misc]
    with pytest.raises(KeyError):
        codes.severity("no-such-code")


# -- plan: group expansion meets the same refusals ------------------------------------------


def test_include_group_with_the_boot_vga_is_refused_without_allow_boot_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # two-gpus-one-group: the RTX 3090 (boot VGA) shares group 1 with the Turing card
    root = fakehost.build(fakehost.load("two-gpus-one-group"), tmp_path / "root")
    before = tree_hash(root)
    args = ["plan", "--root", str(root), "--gpu", "02:00.0", "--include-group"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "[boot-gpu]" in err and err.count("\n") == 1
    assert tree_hash(root) == before
    assert main([*args, "--allow-boot-gpu", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert "0000:01:00.0" in plan["functions"]
    # the console moves off the boot VGA that came with the group
    assert "initcall_blacklist=sysfb_init" in plan["kernel_args"]["set"]


def test_refusal_tells_first_what_no_flag_overrides(hosts: dict[str, Path]) -> None:
    host = discover(str(hosts["amd-b550-chipset"]))
    verdicts = policy.judge_all(host)
    with pytest.raises(SelectionRefused) as info:
        select(host, verdicts, ["2b:00.0"])
    assert info.value.codes == ("route-nic-in-group", "group-shared")
    assert "--include-group" not in str(info.value)  # it would not help
    with pytest.raises(SelectionRefused) as info:
        select(host, verdicts, ["2b:00.0"], include_group=True)
    assert info.value.codes == ("route-nic-in-group",)
    # where the group alone stands in the way, the refusal says how to take it knowingly
    epyc = discover(str(hosts["epyc-v100"]))
    with pytest.raises(SelectionRefused) as info:
        select(epyc, policy.judge_all(epyc), ["03:00.0"])
    assert info.value.codes == ("group-other-gpu",) and "--include-group" in str(info.value)
    sel = select(epyc, policy.judge_all(epyc), ["03:00.0", "04:00.0"])
    assert [str(f.address) for f in sel.functions] == ["0000:03:00.0", "0000:04:00.0"]


# -- render refuses what would harm the host --------------------------------------------------


@pytest.mark.parametrize(
    ("sample", "gpu", "code"),
    [
        ("amd-b550-chipset", "2b:00.0", "route-nic-in-group"),
        ("root-nvme-in-group", "05:00.0", "root-disk-in-group"),
        ("bmc-only-server", "03:00.0", "bmc-vga"),
    ],
)
def test_render_refuses_what_harms_the_host(
    sample: str,
    gpu: str,
    code: str,
    hosts: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "guest.xml"
    args = ["render", "--root", str(hosts[sample]), "--name", "sp", "--gpu", gpu, "-o", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"[{code}]" in err and err.count("\n") == 1
    assert not out.exists()


def test_render_refuses_a_shared_group_card_as_validate_does(
    hosts: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One verdict: epyc-v100's two V100s share IOMMU group 20. One card alone is refused by
    render (exit 2, with the code) as validate --host-root rejects it; both together are
    rendered, and validate accepts what render wrote."""
    root = str(hosts["epyc-v100"])
    args = ["render", "--root", root, "--name", "sp", "--gpu", "03:00.0"]
    assert main(args) == 2
    assert "[group-other-gpu]" in capsys.readouterr().err
    out = tmp_path / "both.xml"
    assert main([*args, "--gpu", "04:00.0", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["validate", "--json", "--host-root", root, str(out)]) == 0
    capsys.readouterr()
    # the same domain without the second card: validate rejects it with render's code
    doc = etree.fromstring(out.read_bytes())
    (second,) = doc.xpath("devices/hostdev[source/address/@bus='0x04']")
    second.getparent().remove(second)
    one = tmp_path / "one.xml"
    one.write_bytes(etree.tostring(doc))
    assert main(["validate", "--json", "--host-root", root, "--select", "host", str(one)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert "group-other-gpu" in {f["code"] for f in report["files"][0]["findings"]}


# -- done when: nothing outside the card (or its group, with --include-group) is bound ------


def _bound(host: Host, plan_actions: list[Action], target_args: ArgChange) -> set[PciAddress]:
    """Every host function the plan's files and arguments would hand to vfio-pci."""
    ids: set[str] = set()
    addresses: set[PciAddress] = set()
    for arg in target_args.set.values():
        if arg.startswith("vfio-pci.ids="):
            ids.update(arg.split("=", 1)[1].split(","))
    for action in plan_actions:
        if not isinstance(action, WriteFile):
            continue
        text = action.content.decode()
        if action.path == vfio.MODPROBE:
            for m in re.finditer(r"^options vfio-pci ids=(\S+)", text, re.M):
                ids.update(m[1].split(","))
        if action.path == vfio.UDEV_RULE:
            addresses.update(_a(m[1]) for m in re.finditer(r'KERNEL=="([^"]+)"', text))
    return addresses | {f.address for f in host.functions if f.id in ids}


def _is_bridge(host: Host, address: PciAddress) -> bool:
    fn = host.function(address)
    return fn is not None and fn.is_bridge_like


def _roots(hosts: dict[str, Path], snapshot_root: Path) -> dict[str, Path]:
    return {**hosts, "h100-guest-snapshot": snapshot_root}


def test_no_plan_binds_a_device_outside_the_card(
    hosts: dict[str, Path], snapshot_root: Path
) -> None:
    accepted = 0
    for name, path in _roots(hosts, snapshot_root).items():
        host = discover(str(path))
        verdicts = policy.judge_all(host)
        critical = set(host.critical.root_pci) | set(host.critical.nic_pci)
        choices: list[tuple[str, ...]] = [()] + [(str(v.gpu.address),) for v in verdicts]
        for gpus in choices:
            for include_group in (False, True):
                opts = PlanOptions(gpus=gpus, include_group=include_group, allow_boot_gpu=True)
                try:
                    sel = select(host, verdicts, list(gpus), include_group, True)
                except (SelectionRefused, NoSuchCard):
                    continue
                cards = {f.address for v in sel.cards for f in v.gpu.functions}
                allowed = set(cards)
                if include_group:
                    allowed |= {
                        a for v in sel.cards for a in v.group_members if not _is_bridge(host, a)
                    }
                where = f"{name} --gpu {gpus} include_group={include_group}"
                assert {f.address for f in sel.functions} <= allowed, where
                try:
                    plan, _ = make_plan(HostRoot(str(path)), host, opts)
                except NixosRefused as exc:  # nothing planned: only lines for the admin
                    assert "configuration.nix" in str(exc), where
                    continue
                except UnknownBootloader:  # the snapshot has no bootloader: the files still
                    bound = {f.address for f in sel.functions}  # come from the selection
                    if not sel.ids_ambiguous:
                        bound |= {f.address for f in host.functions if f.id in sel.vfio_ids}
                else:
                    bound = _bound(host, plan.actions, plan.target_args)
                accepted += 1
                assert bound <= allowed, f"{where}: {sorted(map(str, bound - allowed))}"
                assert not bound & critical, where
                assert not any(_is_bridge(host, a) for a in bound), where
                if not include_group:
                    assert bound <= cards, where
    assert accepted >= len(hosts)  # the check ran on real plans, not only on refusals
