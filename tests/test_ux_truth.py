# SPDX-License-Identifier: Apache-2.0
"""Never say done when it isn't: what a new user walking the CLI over a sample host read
that was not so (undo's words for a file it removed, the reboot before the listed
commands, verify after undo), each through the real CLI."""

from __future__ import annotations

import argparse
import itertools
import shutil
from pathlib import Path

from tests.cli_process import run_cli


def _applied(hosts: dict[str, Path], tmp_path: Path) -> Path:
    root = tmp_path / "root"
    shutil.copytree(hosts["turing-desktop"], root, symlinks=True)
    got = run_cli(["apply", "--root", str(root), "--yes"])
    assert got.returncode == 0, got.stderr
    return root


def test_list_mode_apply_says_run_the_commands_first_then_reboot(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(hosts["turing-desktop"], root, symlinks=True)
    out = run_cli(["apply", "--root", str(root), "--yes"]).stdout
    lines = out.splitlines()
    first = lines.index("Not run (--root is not a full OS tree): run them inside the root first:")
    assert lines[first + 1 : first + 3] == [
        "  mkinitcpio -P",
        "  kernel-install add 6.11.5-arch1-1 /usr/lib/modules/6.11.5-arch1-1/vmlinuz",
    ]
    assert lines[first + 3 :] == ["Then reboot, and run `passthrough verify`."]
    assert not any(line.startswith("Reboot") for line in lines)


def test_undo_says_removed_for_a_file_apply_created_and_reboot_after_the_commands(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _applied(hosts, tmp_path)
    created = root / "etc/modprobe.d/passthrough-vfio.conf"
    assert created.exists()
    got = run_cli(["undo", "--root", str(root), "--yes"])
    assert got.returncode == 0, got.stderr
    assert not created.exists()
    lines = got.stdout.splitlines()
    assert "  · remove /etc/modprobe.d/passthrough-vfio.conf" in got.stderr + got.stdout
    assert "restore /etc/modprobe.d/passthrough-vfio.conf" not in got.stderr + got.stdout
    assert lines[0] == "Restored 2 files; removed 1 file apply created."
    assert lines[1].endswith("run them inside the root first:")
    assert lines[2:4] == [
        "  mkinitcpio -P",
        "  kernel-install add 6.11.5-arch1-1 /usr/lib/modules/6.11.5-arch1-1/vmlinuz",
    ]
    assert lines[4:] == ["Then reboot to return to the original kernel arguments and drivers."]


def test_verify_after_undo_says_the_host_was_undone_and_checks_nothing_of_ours_is_left(
    hosts: dict[str, Path], tmp_path: Path
) -> None:
    root = _applied(hosts, tmp_path)
    assert run_cli(["undo", "--root", str(root), "--yes"]).returncode == 0
    got = run_cli(["verify", "--root", str(root)])
    assert "no passthrough apply" not in got.stdout
    assert "the host was undone" in got.stdout
    assert "none of our vfio arguments live" in got.stdout
    assert "none of the 4 functions apply handed over is on vfio" in got.stdout
    # the undo's regenerations were only listed: told, with the way to finish
    assert "2 commands of the undo never ran" in got.stdout
    assert got.returncode == 0
    # the running kernel still carrying our binding argument (no reboot yet) fails
    cmdline = root / "proc/cmdline"
    ids = "vfio-pci.ids=10de:1e87,10de:10f8,10de:1ad8,10de:1ad9"
    cmdline.write_text(cmdline.read_text().strip() + f" {ids}\n")
    got = run_cli(["verify", "--root", str(root)])
    assert got.returncode == 1
    assert f"FAIL  kernel-args  still live: {ids}" in got.stdout


def _levels(out: str, code: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines() if line.split()[1:2] == [code]]


def test_acs_override_is_one_level_in_check_scan_and_kubevirt_preflight(
    hosts: dict[str, Path],
) -> None:
    root = str(hosts["acs-override-proxmox"])
    check = run_cli(["check", "--root", root]).stdout
    preflight = run_cli(["kubevirt", "preflight", "--root", root])
    assert _levels(check, "acs-override") == ["WARN"]
    assert _levels(preflight.stdout, "acs-override") == ["WARN"]
    assert "[acs-override]" in run_cli(["scan", "--root", root]).stdout  # a `!` warning there
    # the label is still withheld over it, and says why
    label = next(line for line in preflight.stdout.splitlines() if "kube-mode-label" in line)
    assert label.startswith("FAIL") and "acs-override above" in label
    assert preflight.returncode == 1


def test_preflight_bind_and_label_advice_reach_a_fixed_point(hosts: dict[str, Path]) -> None:
    """turing-desktop: the card on its host drivers is all that fails. The binding's fix
    must not send the reader to the label, whose fix sends them back to the binding."""
    out = run_cli(["kubevirt", "preflight", "--root", str(hosts["turing-desktop"])]).stdout
    fixes: dict[str, str] = {}
    for line, after in itertools.pairwise(out.splitlines()):
        if line.startswith("FAIL") and after.strip().startswith("fix: "):
            fixes[line.split()[1]] = after.strip()
    assert set(fixes) == {"kube-vfio-bound", "kube-mode-label"}
    assert "label" not in fixes["kube-vfio-bound"]
    assert "passthrough bind" in fixes["kube-vfio-bound"]
    assert "vfio-manager binds them" in fixes["kube-mode-label"]
    assert "every other check passes" in out


def test_check_does_not_count_an_integrated_gpu_as_passable(hosts: dict[str, Path]) -> None:
    for name, igpu in (("optimus-laptop", "0000:00:02.0"), ("amd-apu-desktop", "0000:30:00.0")):
        out = run_cli(["check", "--root", str(hosts[name])]).stdout
        line = next(line for line in out.splitlines() if line.split()[1:2] == ["gpu-viable"])
        assert line.split(None, 2)[2] == (
            "1 of 1 GPU can be passed through: 0000:01:00.0; "
            f"integrated {igpu} not counted (this toolkit targets discrete cards)"
        )
    scan = run_cli(["scan", "--root", str(hosts["amd-apu-desktop"])]).stdout
    assert "[apu-igpu]" in scan


def test_dra_claim_selects_each_card_by_its_pci_address(hosts: dict[str, Path]) -> None:
    import yaml

    got = run_cli(
        [
            "kubevirt", "render", "--root", str(hosts["hgx-h100"]), "--name", "h100",
            "--route", "dra", "--gpu", "18:00.0", "--gpu", "9a:00.0", "--memory", "64G",
        ]
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    claim = next(d for d in yaml.safe_load_all(got.stdout) if d["kind"] == "ResourceClaimTemplate")
    requests = claim["spec"]["spec"]["devices"]["requests"]
    assert [(r["name"], r["exactly"]["selectors"]) for r in requests] == [
        (
            f"gpu{n}",
            [
                {
                    "cel": {
                        "expression": f"device.attributes['resource.kubernetes.io'].pciBusID == '{a}'"
                    }
                }
            ],
        )
        for n, a in ((1, "0000:18:00.0"), (2, "0000:9a:00.0"))
    ]


def _parsers(parser: argparse.ArgumentParser, path: str = "") -> dict[str, argparse.ArgumentParser]:
    found = {path: parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _parsers(sub, f"{path} {name}".strip())
    return found


def test_every_commands_help_opens_with_a_description_and_has_examples() -> None:
    """Each of the 20 commands and 19 actions: after the usage lines, a description (not
    straight into the arguments), and examples; the real --help of one action says it."""
    from passthrough.cli import build_parser

    parsers = _parsers(build_parser())
    assert len(parsers) == 40
    for path, parser in parsers.items():
        text = parser.format_help()
        after_usage = text.split("\n\n", 1)[1]
        first = after_usage.splitlines()[0]
        assert first not in ("positional arguments:", "options:"), f"{path}: no description"
        assert parser.description and parser.description.endswith("."), path
        assert "examples:\n" in text, f"{path}: no examples"
    got = run_cli(["vm", "start", "--help"])
    assert got.stdout.split("\n\n")[1] == "Start a defined domain."


def test_undo_json_names_the_files_it_removed_apart(hosts: dict[str, Path], tmp_path: Path) -> None:
    """The files apply created are in `restored` (put back as before: absent) and, apart,
    in `removed`; the CLI's sentence and the JSON come from the same decisions."""
    import json

    root = _applied(hosts, tmp_path)
    got = run_cli(["undo", "--root", str(root), "--yes", "--json"])
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    assert out["removed"] == ["/etc/modprobe.d/passthrough-vfio.conf"]
    assert set(out["removed"]) < set(out["restored"]) and len(out["restored"]) == 3
    assert not (root / "etc/modprobe.d/passthrough-vfio.conf").exists()
    # status names it the same way: removed, not "restored"
    shown = run_cli(["status", "--root", str(root)]).stdout.splitlines()
    assert "  removed   /etc/modprobe.d/passthrough-vfio.conf  [undone]" in shown
    assert "  restored  /etc/kernel/cmdline  [undone]" in shown
