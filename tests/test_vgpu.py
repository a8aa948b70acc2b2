# SPDX-License-Identifier: Apache-2.0
"""vGPU on roots with catalogs this test writes itself (the real captures are in
test_vgpu_realworld.py): the catalog's format, bad input refused in one line with nothing
changed, sysfs steps in the journal, a card without vGPU and why, the hostdev forms."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from passthrough.cli import main
from passthrough.host.root import HostRoot
from passthrough.journal.apply import session
from passthrough.journal.devices import device_of, write_attr
from passthrough.journal.journal import Journal, StepKind, StepState, TxKind
from passthrough.model import PciAddress
from passthrough.vgpu.discover import parse_catalog
from passthrough.vgpu.hostdev import NoSuchVgpu, hostdev_for
from passthrough.vgpu.model import Mode, Vf, VgpuCard

from .vgpu_standin import L40S_PF, l40s_root

# The driver's format: a header line, then "<id> : <name>" rows, the id padded to six
CATALOG = "ID    : vGPU Name\n10    : NVIDIA T1-4Q\n11    : NVIDIA T1-8Q\n12    : NVIDIA T1-8A\n"


def test_the_catalog_is_a_header_then_id_name_rows() -> None:
    problems: list[str] = []
    types = parse_catalog(CATALOG + "\n" + "junk line\n", "cat", problems)
    assert [(t.id, t.name, t.short) for t in types] == [
        (10, "NVIDIA T1-4Q", "T1-4Q"),
        (11, "NVIDIA T1-8Q", "T1-8Q"),
        (12, "NVIDIA T1-8A", "T1-8A"),
    ]
    assert problems == ["cat: line 6 is not '<id> : <name>': junk line"]
    assert parse_catalog("ID    : vGPU Name\n", "cat") == []  # a configured VF's: empty
    assert [t.id for t in parse_catalog("7 : NVIDIA T1-1B\n", "cat")] == [7]  # no header


def tree(root: Path) -> dict[str, str]:
    out = {}
    for d, _dirs, files in os.walk(root):
        for name in files:
            p = os.path.join(d, name)
            if not os.path.islink(p):
                out[os.path.relpath(p, root)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--card", "nonsense"], "--card 'nonsense': not a PCI address (e.g. 0000:41:00.0)"),
        (
            ["--card", "0000:99:00.0"],
            "--card 0000:99:00.0: no NVIDIA card there (NVIDIA cards: 0000:26:00.0)",
        ),
        (
            ["--type", "T1-2Q"],
            "--type 'T1-2Q': 0000:26:00.0 offers no such type; it offers: T1-4Q, T1-8Q, T1-8A",
        ),
        (["--count", "0"], "--count 0: at least 1"),
        (["--count", "5"], "0000:26:00.0: room for 4 more T1-4Q, not 5 (4 free VFs of 4)"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    root = l40s_root(tmp_path, catalog=CATALOG)
    before = tree(root)
    given = {"--card": L40S_PF, "--type": "T1-4Q", "--count": "1"}
    given.update(dict(zip(args[::2], args[1::2], strict=True)))
    flat = [x for kv in given.items() for x in kv]
    for action in ("plan", "apply"):
        assert main(["vgpu", action, "--root", str(root), *flat]) == 2
        assert capsys.readouterr().err.splitlines() == [f"passthrough: error: {message}"]
    assert tree(root) == before and not (root / "var/lib/passthrough").exists()


def test_a_sysfs_step_keeps_pf_vf_id_and_name_in_the_journal(tmp_path: Path) -> None:
    root = l40s_root(tmp_path, catalog=CATALOG)
    r = HostRoot(str(root))
    rel = "sys/bus/pci/devices/0000:26:00.4/nvidia/current_vgpu_type"
    device = {"pf": L40S_PF, "vf": "0000:26:00.4", "type_id": "11", "type_name": "NVIDIA T1-8Q"}
    with session(r) as journal:
        tx = journal.begin(TxKind.APPLY)
        step = write_attr(journal, tx, rel, "11", undo_value="0", device=device)
    assert step.state is StepState.DONE and (root / rel).read_text() == "11\n"
    (again,) = Journal.load(r).transactions[0].steps  # saved and read back
    assert again.kind is StepKind.SYSFS and not again.is_file
    assert again.undo_argv == [rel, "0"]
    assert device_of(again) == {**device, "before": "0"}
    assert Journal.load(r).transactions[0].file_steps() == []


def test_a_card_without_vgpu_says_why(
    tmp_path: Path, hosts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["vgpu", "list", "--root", str(hosts["hgx-h100"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("0000:")
    assert "mode: none (no SR-IOV VFs and no mdev types: not the vGPU host driver" in lines[0]


def test_hostdev_for_refuses_what_is_not_a_vgpu() -> None:
    vf = Vf(PciAddress.parse("0000:26:00.4"), "nvidia")
    card = VgpuCard(PciAddress.parse(L40S_PF), None, "nvidia", Mode.VENDOR_VFIO, "", (vf,))
    with pytest.raises(NoSuchVgpu, match="no vGPU type on it yet"):
        hostdev_for((card,), "0000:26:00.4")
    with pytest.raises(NoSuchVgpu, match="not a VF of a vGPU card"):
        hostdev_for((card,), "0000:27:00.4")
    with pytest.raises(NoSuchVgpu, match="neither a VF address nor an mdev's UUID"):
        hostdev_for((card,), "gpu-one")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("cards:\n  0000:26:00.0: {T1-4Q: 1}\n", "card 1560.0: quote the address"),
        ('cards:\n  "0000:26:00.0": {T1-4Q: 1, T1-8Q: 1}\n', "one type per card"),
        ('cards:\n  "0000:26:00.0": {T1-4Q: two}\n', "expected TYPE: COUNT, got 'T1-4Q': 'two'"),
        ("- a list\n", "expected 'cards:' mapping each card to {TYPE: COUNT}"),
        (
            'cards:\n  "0000:26:00.0": {T1-9Q: 1}\n',
            "--type 'T1-9Q': 0000:26:00.0 offers no such type",
        ),
    ],
)
def test_a_bad_layout_file_is_refused_before_anything_is_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    root = l40s_root(tmp_path, catalog=CATALOG)
    before = tree(root)
    layout = tmp_path / "vgpu.yaml"
    layout.write_text(text)
    assert main(["vgpu", "apply", "--root", str(root), "--layout", str(layout)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert message in line
    assert tree(root) == before and not (root / "var/lib/passthrough").exists()


def test_a_layout_file_applies_like_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = l40s_root(tmp_path, catalog=CATALOG)
    layout = tmp_path / "vgpu.yaml"
    layout.write_text('cards:\n  "0000:26:00.0": {T1-8Q: 2}\n')
    assert main(["vgpu", "apply", "--root", str(root), "--layout", str(layout)]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("Created 2 T1-8Q on 0000:26:00.0")
    types = [
        (root / f"sys/bus/pci/devices/0000:26:00.{f}/nvidia/current_vgpu_type").read_text()
        for f in (4, 5, 6)
    ]
    assert types == ["11\n", "11\n", "0\n"]
    assert (
        main(["vgpu", "apply", "--root", str(root), "--layout", str(layout), "--count", "1"]) == 2
    )
    assert capsys.readouterr().err.strip() == "passthrough: error: --layout or --count: not both"


def _role_params(root: Path, layout: object) -> dict[str, object]:
    """The host module's validated parameters, as the role passes them (its defaults)."""
    from passthrough.plan.options import ansible_argument_spec

    params: dict[str, object] = {k: v["default"] for k, v in ansible_argument_spec().items()}
    params |= {"root": str(root), "state": "present", "preflight": ["cpu-virtualization"]}
    return params | {"vgpu_layout": layout, "vgpu_run_root_tools": False}


def test_the_host_task_plans_applies_then_leaves_a_layout_in_place(tmp_path: Path) -> None:
    """The host role's task (passthrough/hosttask.py) with a layout as Ansible passes it:
    check mode plans without writing, the run applies through the vGPU journal with no
    whole card for vfio-pci and no reboot, and a second run reports the card unchanged."""
    from passthrough.hosttask import run

    root = l40s_root(tmp_path, catalog=CATALOG)
    before = tree(root)
    params = _role_params(root, {L40S_PF: {"T1-8Q": 2}})
    planned = run(params, check_mode=True)
    assert planned["changed"] and planned["vgpu"][0]["state"] == "planned"
    assert tree(root) == before
    done = run(params, check_mode=False)
    assert done["changed"] and not done["reboot_required"] and "plan" not in done
    (card,) = done["vgpu"]
    assert (card["type"], card["count"], card["state"]) == ("T1-8Q", 2, "applied")
    assert card["vfs"] == ["0000:26:00.4", "0000:26:00.5"]
    assert done["vgpu_transactions"] == [card["transaction"]]
    assert not (root / "etc/default/grub.d/99-passthrough.cfg").exists()
    again = run(params, check_mode=False)
    assert not again["changed"] and again["vgpu"][0]["state"] == "unchanged"
    assert again["vgpu"][0]["vfs"] == card["vfs"] and "vgpu_transactions" not in again


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        # an unquoted address in the inventory: YAML 1.1 reads it as base 60, and Ansible
        # passes the mapping to the module as JSON, so the key arrives as "1560.0"
        ({"1560.0": {"T1-4Q": 1}}, "card '1560.0': quote the address"),
        ({L40S_PF: {"T1-4Q": 5}}, "0000:26:00.0: room for 4 more T1-4Q, not 5"),
        ({L40S_PF: {"T1-4Q": 0}}, "--count 0: at least 1"),
        (["0000:26:00.0"], "expected a mapping of each card to {TYPE: COUNT}"),
        ({"0000:42:00.0": {"T1-4Q": 1}}, "--card 0000:42:00.0: no NVIDIA card there"),
        ({L40S_PF: {"T1-4Q": 1}, "26:00.0": {"T1-4Q": 1}}, "0000:26:00.0 is named twice"),
    ],
)
def test_the_host_task_refuses_a_bad_layout_in_one_line_with_nothing_changed(
    tmp_path: Path, layout: object, message: str
) -> None:
    from passthrough.hosttask import run
    from passthrough.vgpu.plan import LayoutRefused

    root = l40s_root(tmp_path, catalog=CATALOG)
    before = tree(root)
    with pytest.raises(LayoutRefused) as refused:
        run(_role_params(root, layout), check_mode=False)
    line = str(refused.value)
    assert line.startswith("passthrough_host_vgpu_layout: ") and "\n" not in line
    assert message in line
    assert refused.value.exit_code == 2
    assert tree(root) == before and not (root / "var/lib/passthrough").exists()


def test_the_host_task_refuses_a_card_holding_another_layout(tmp_path: Path) -> None:
    from passthrough.hosttask import run
    from passthrough.vgpu.plan import LayoutRefused

    root = l40s_root(tmp_path, catalog=CATALOG)
    run(_role_params(root, {L40S_PF: {"T1-8Q": 2}}), check_mode=False)
    applied = tree(root)
    for other in ({"T1-8Q": 3}, {"T1-4Q": 2}):
        with pytest.raises(LayoutRefused, match=r"0000:26:00\.0 holds 2 T1-8Q, not "):
            run(_role_params(root, {L40S_PF: other}), check_mode=False)
    assert tree(root) == applied


def test_after_a_reboot_the_host_task_re_applies_the_record_not_a_second_layout(
    tmp_path: Path,
) -> None:
    """The boot unit did not run after a reboot (every VF back at type 0): the role's next
    run re-applies the recorded layout as the unit would — the same VFs, no new transaction,
    the record as it was — and reports it; a different layout wanted then is refused in one
    line with nothing changed."""
    from passthrough.hosttask import run
    from passthrough.vgpu.plan import LayoutRefused
    from passthrough.vgpu.unit import LAYOUT

    root = l40s_root(tmp_path, catalog=CATALOG)
    params = _role_params(root, {L40S_PF: {"T1-8Q": 2}})
    first = run(params, check_mode=False)["vgpu"][0]
    record = (root / LAYOUT).read_bytes()
    for f in (4, 5):  # the reboot: the driver starts every VF without a type
        (root / f"sys/bus/pci/devices/0000:26:00.{f}/nvidia/current_vgpu_type").write_text("0\n")
    rebooted = tree(root)
    with pytest.raises(LayoutRefused, match=r"recorded layout \(2 T1-8Q\) is not in place"):
        run(_role_params(root, {L40S_PF: {"T1-4Q": 1}}), check_mode=False)
    assert tree(root) == rebooted
    checked = run(params, check_mode=True)
    assert checked["changed"] and checked["vgpu"][0]["state"] == "restore"
    assert tree(root) == rebooted
    again = run(params, check_mode=False)
    assert again["changed"] and again["vgpu_restored"] == [L40S_PF]
    assert again["vgpu_transactions"] == []  # no new transaction
    (card,) = again["vgpu"]
    assert (card["state"], card["vfs"]) == ("restored", first["vfs"])
    types = [
        (root / f"sys/bus/pci/devices/0000:26:00.{f}/nvidia/current_vgpu_type").read_text()
        for f in (4, 5, 6)
    ]
    assert types == ["11\n", "11\n", "0\n"]
    assert (root / LAYOUT).read_bytes() == record  # no second layout on record
    from passthrough.provision.outcome import vgpu_lines

    assert vgpu_lines("h", checked["vgpu"], check=True)[0].endswith(
        "on record, not in place: would be re-applied"
    )
    assert vgpu_lines("h", again["vgpu"], check=False) == [
        "vgpu h: 0000:26:00.0 2 x T1-8Q on 0000:26:00.4, 0000:26:00.5: re-applied from its "
        "record (the boot unit had not)"
    ]
    assert run(params, check_mode=False)["vgpu"][0]["state"] == "unchanged"
