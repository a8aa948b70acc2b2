"""The playbooks for real: syntax-check, ansible-lint (production), ansible-playbook through
ansible-runner against sample host roots with the local connection (check mode, for real,
idempotent), bad inventory values, the vm role on a real libvirtd, and every Kubernetes
manifest validated offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from passthrough import fakehost
from passthrough.cli import main
from passthrough.provision.runner import run, summary_table

REPO = Path(__file__).parents[1]
PLAYBOOKS = REPO / "playbooks"
BIN = Path(sys.executable).parent


def _inventory(
    tmp_path: Path,
    hosts: dict[str, dict[str, Any]],
    guests: dict[str, dict[str, Any]] | None = None,
) -> Path:
    # the library is this interpreter's own (no venv on the host: tests/test_collection.py
    # covers that); become goes through the real sudo, as root
    common = {
        "ansible_connection": "local",
        "ansible_python_interpreter": sys.executable,
        "passthrough_runtime": "none",
    }
    data = {
        "all": {
            "children": {
                "gpu_hosts": {"hosts": {name: {**common, **v} for name, v in hosts.items()}},
                "gpu_guests": {
                    "hosts": {name: {**common, **v} for name, v in (guests or {}).items()}
                },
            }
        }
    }
    path = tmp_path / "inventory.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def _root(tmp_path: Path, name: str, sample: str) -> Path:
    return fakehost.build(fakehost.load(sample), tmp_path / name)


@pytest.mark.parametrize("playbook", ["site.yml", "host.yml", "vm.yml", "guest.yml"])
def test_syntax_check(playbook: str) -> None:
    r = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "--syntax-check",
            "-i",
            str(REPO / "inventory/example/hosts.yml"),
            playbook,
        ],
        cwd=PLAYBOOKS,
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ansible_lint_production_profile() -> None:
    env = {**os.environ, "NO_COLOR": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    r = subprocess.run(
        [str(BIN / "ansible-lint"), "--profile", "production", "--format=pep8", "."],
        cwd=PLAYBOOKS,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Profile 'production' was required, and it passed" in r.stdout + r.stderr


def test_host_play_check_then_apply_then_nothing(tmp_path: Path) -> None:
    a = _root(tmp_path, "a", "consumer-intel")
    b = _root(tmp_path, "b", "hgx-h100")
    inv = _inventory(
        tmp_path,
        {
            "host-a": {"passthrough_root": str(a)},
            "host-b": {
                "passthrough_root": str(b),
                "passthrough_host_gpus": ["0000:18:00.0", "0000:19:00.0"],
                "passthrough_host_hugepages": 16,
            },
        },
    )
    check = run(str(inv), "host.yml", check=True, diff=True)
    assert check.ok, summary_table(check)
    assert check.hosts["host-a"].changed >= 1 and check.hosts["host-b"].changed >= 1
    assert not (a / "etc/modprobe.d/passthrough-vfio.conf").exists()  # check mode wrote nothing
    real = run(str(inv), "host.yml")
    assert real.ok, summary_table(real)
    assert (
        "vfio-pci.ids=10de:2684,10de:22ba"
        in (a / "etc/default/grub.d/99-passthrough.cfg").read_text()
    )
    assert "hugepages=16" in (b / "etc/default/grub.d/99-passthrough.cfg").read_text()
    assert (
        'KERNEL=="0000:18:00.0"' in (b / "etc/udev/rules.d/40-passthrough-vfio.rules").read_text()
    )
    again = run(str(inv), "host.yml")
    assert again.ok and {h.changed for h in again.hosts.values()} == {0}, summary_table(again)
    # state: absent undoes everything
    undone = run(str(inv), "host.yml", extravars={"passthrough_host_state": "absent"})
    assert undone.ok and not (a / "etc/default/grub.d/99-passthrough.cfg").exists()


def test_bad_values_stop_that_host_and_others_go_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = _root(tmp_path, "good", "consumer-intel")
    typo = _root(tmp_path, "typo", "consumer-intel")
    nogpu = _root(tmp_path, "nogpu", "consumer-intel")
    noiommu = _root(tmp_path, "noiommu", "consumer-intel")
    (noiommu / "sys/firmware/acpi/tables/DMAR").unlink()
    shutil.rmtree(noiommu / "sys/class/iommu")
    inv = _inventory(
        tmp_path,
        {
            "good": {"passthrough_root": str(good)},
            "typo": {"passthrough_root": str(typo), "passthrough_host_iommu_pt": "maybe"},
            "nogpu": {"passthrough_root": str(nogpu), "passthrough_host_gpus": ["0000:42:00.0"]},
            "noiommu": {"passthrough_root": str(noiommu)},
            "gone": {
                "ansible_connection": "ssh",
                "ansible_host": "127.0.0.1",
                "ansible_port": 1,
                "passthrough_root": "/",
            },
        },
    )
    code = main(
        [
            "provision",
            "-i",
            str(inv),
            "--playbook",
            "host.yml",
            "--json",
            "--log",
            str(tmp_path / "run.log"),
        ]
    )
    assert code == 4  # hosts failed under Ansible: EXIT_BACKEND, with --json as without
    report = json.loads(capsys.readouterr().out)
    hosts = report["hosts"]
    assert (
        hosts["good"]["status"] == "changed"
        and (good / "etc/modprobe.d/passthrough-vfio.conf").exists()
    )
    assert (
        hosts["typo"]["status"] == "failed"
        and "passthrough_host_iommu_pt" in hosts["typo"]["reason"]
    )
    assert (
        hosts["nogpu"]["status"] == "failed"
        and "--gpu 0000:42:00.0: matches no GPU" in hosts["nogpu"]["reason"]
    )
    assert hosts["noiommu"]["status"] == "failed" and "iommu-firmware" in hosts["noiommu"]["reason"]
    assert hosts["gone"]["status"] == "unreachable"
    for name in ("typo", "nogpu", "noiommu"):
        assert not (tmp_path / name / "etc/modprobe.d/passthrough-vfio.conf").exists()
    assert (tmp_path / "run.log").read_text().count("TASK [") > 3
    # fixing the typo and re-running picks up where it stopped; the good host has nothing to do
    inv.write_text(
        inv.read_text().replace(
            "passthrough_host_iommu_pt: maybe", "passthrough_host_iommu_pt: true"
        )
    )
    again = run(str(inv), "host.yml", limit="good,typo")
    assert again.ok, summary_table(again)
    assert again.hosts["good"].changed == 0 and again.hosts["typo"].changed >= 1


def test_provision_for_people_prints_a_summary_and_exits_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root(tmp_path, "r", "consumer-intel")
    inv = _inventory(
        tmp_path,
        {"lonely": {"passthrough_root": str(root), "passthrough_host_gpus": ["0000:42:00.0"]}},
    )
    assert (
        main(
            [
                "provision",
                "-i",
                str(inv),
                "--playbook",
                "host.yml",
                "--log",
                str(tmp_path / "l.log"),
            ]
        )
        == 4  # Ansible failed underneath (EXIT_BACKEND)
    )
    captured = capsys.readouterr()
    assert "lonely  failed" in captured.out and "matches no GPU" in captured.out
    assert "PLAY Prepare GPU passthrough hosts" in captured.err  # live progress
    assert captured.err.strip().splitlines()[-1] == (
        "passthrough: error: lonely failed (status failed, rc 2); see the log"
    )


def test_sample_site_play_reaches_a_defined_guest(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["provision", "-i", str(REPO / "inventory/sample/hosts.yml"), "--sample", "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["hosts"]["sample-hgx"]["changed"] == 2


def test_vm_role_refuses_a_card_not_handed_over(tmp_path: Path) -> None:
    root = _root(tmp_path, "r", "hgx-h100")
    inv = _inventory(
        tmp_path,
        {
            "h": {
                "passthrough_root": str(root),
                "passthrough_vm_uri": "test:///default",
                "passthrough_vm_wait_ssh": False,
                "passthrough_vm_guests": [{"name": "g1", "gpus": ["0000:9a:00.0"]}],
            }
        },
    )
    result = run(str(inv), "vm.yml")
    assert not result.ok
    assert "0000:9a:00.0 is not handed over to vfio-pci" in (result.hosts["h"].reason or "")


def _dumpxml(name: str) -> str:
    return subprocess.run(
        ["virsh", "-c", "qemu:///system", "dumpxml", "--inactive", name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def test_vm_role_defines_on_a_real_libvirtd_idempotently(tmp_path: Path) -> None:
    """Defined, then nothing to do; a guest changed in the inventory shows as changed with
    the difference (--diff), check mode leaves the domain as it is, a real run redefines it,
    and then there is nothing to do again."""
    assert os.geteuid() == 0, "needs root for the real libvirtd (CI runs as root)"
    subprocess.run(
        ["bash", str(REPO / "scripts/libvirtd-up.sh")], check=True, capture_output=True, timeout=60
    )
    root = _root(tmp_path, "r", "hgx-h100")
    name = "passthrough-collection-vm-test"
    guest = {
        "name": name,
        "gpus": ["0000:18:00.0", "0000:19:00.0"],
        "vcpus": 4,
        "memory_mib": 4096,
        "state": "defined",
    }
    host = {
        "passthrough_root": str(root),
        "passthrough_host_gpus": ["0000:18:00.0", "0000:19:00.0"],
        "passthrough_vm_uri": "qemu:///system",
        "passthrough_vm_wait_ssh": False,
        "passthrough_vm_guests": [guest],
    }
    inv = _inventory(tmp_path, {"h": host})
    try:
        first = run(str(inv), "site.yml")
        assert first.ok and first.hosts["h"].changed >= 2, summary_table(first)
        status = _dumpxml(name)
        assert "<hidden state='on'/>" in status and "bus='0x18'" in status
        uuid = status.split("<uuid>")[1].split("</uuid>")[0]
        second = run(str(inv), "site.yml")
        assert second.ok and second.hosts["h"].changed == 0, summary_table(second)
        # the inventory now asks for 8 vCPUs and one card fewer
        inv = _inventory(
            tmp_path,
            {
                "h": {
                    **host,
                    "passthrough_vm_guests": [{**guest, "vcpus": 8, "gpus": ["0000:18:00.0"]}],
                }
            },
        )
        log = tmp_path / "diff.log"
        check = run(str(inv), "vm.yml", check=True, diff=True, log_path=str(log))
        assert check.ok and check.hosts["h"].changed == 1, summary_table(check)
        shown = log.read_text()
        assert "domain passthrough-collection-vm-test (libvirt)" in shown, shown
        assert '-  <vcpu placement="static">4</vcpu>' in shown
        assert '+  <vcpu placement="static">8</vcpu>' in shown
        assert 'bus="0x19"' in shown  # the card that goes, on the before side
        assert "<vcpu placement='static'>4</vcpu>" in _dumpxml(name)  # check mode: untouched
        real = run(str(inv), "vm.yml")
        assert real.ok and real.hosts["h"].changed == 1, summary_table(real)
        now = _dumpxml(name)
        assert "<vcpu placement='static'>8</vcpu>" in now and "bus='0x19'" not in now
        assert f"<uuid>{uuid}</uuid>" in now  # the same domain, redefined
        again = run(str(inv), "vm.yml")
        assert again.ok and again.hosts["h"].changed == 0, summary_table(again)
    finally:
        subprocess.run(
            ["virsh", "-c", "qemu:///system", "undefine", "--nvram", name],
            capture_output=True,
            check=False,
        )


def test_guest_role_manifests_twice_change_nothing_the_second_time(tmp_path: Path) -> None:
    """The part of the guest role that runs here (the manifests; the rest installs packages
    in a real guest) is idempotent: a second run changes nothing."""
    out = tmp_path / "manifests"
    inv = _inventory(tmp_path, {}, {"gpu-guest-1": {}})
    extravars = {
        "passthrough_guest_k8s_enabled": True,
        "passthrough_guest_gfd_enabled": True,
        "passthrough_guest_k8s_manifest_dir": str(out),
    }
    first = run(str(inv), "guest.yml", tags="manifests", extravars=extravars)
    assert first.ok and first.hosts["gpu-guest-1"].changed >= 1, summary_table(first)
    second = run(str(inv), "guest.yml", tags="manifests", extravars=extravars)
    assert second.ok and second.hosts["gpu-guest-1"].changed == 0, summary_table(second)


SHARING = ["none", "time-slicing", "mps"]
K8S_VERSIONS = ["1.35.0", "1.36.0", "1.37.0"]


@pytest.mark.parametrize("sharing", SHARING)
def test_kubernetes_manifests_validate_offline(sharing: str, tmp_path: Path) -> None:
    out = tmp_path / "manifests"
    inv = _inventory(tmp_path, {}, {"gpu-guest-1": {}})
    result = run(
        str(inv),
        "guest.yml",
        tags="manifests",
        extravars={
            "passthrough_guest_k8s_enabled": True,
            "passthrough_guest_gfd_enabled": True,
            "passthrough_guest_windows_directx": True,
            "passthrough_guest_sharing": sharing,
            "passthrough_guest_sharing_replicas": 8,
            "passthrough_guest_k8s_manifest_dir": str(out),
        },
    )
    assert result.ok, summary_table(result)
    files = sorted(out.glob("*.yaml"))
    assert {f.stem for f in files} == {
        "runtimeclass",
        "device-plugin-config",
        "device-plugin",
        "vectoradd-pod",
        "gpu-feature-discovery",
        "windows-directx-device-plugin",
        "windows-directx-workload",
    }
    for version in K8S_VERSIONS:
        r = subprocess.run(
            [str(BIN / "kubernetes-validate"), "--strict", "-k", version, *map(str, files)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    config = yaml.safe_load(
        yaml.safe_load((out / "device-plugin-config.yaml").read_text())["data"]["config.yaml"]
    )
    if sharing == "none":
        assert "sharing" not in config
    else:
        key = "timeSlicing" if sharing == "time-slicing" else "mps"
        assert config["sharing"][key]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 8}]
    ds = yaml.safe_load((out / "device-plugin.yaml").read_text())
    spec = ds["spec"]["template"]["spec"]
    assert (
        ds["metadata"]["name"] == "nvidia-device-plugin-daemonset"
        and ds["metadata"]["namespace"] == "kube-system"
    )
    assert spec["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert spec["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
        "tolerations"
    ]
    assert spec["volumes"][0]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    pod = yaml.safe_load((out / "vectoradd-pod.yaml").read_text())
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    win = yaml.safe_load((out / "windows-directx-device-plugin.yaml").read_text())
    env = win["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"]
    assert env == "class/5B45201D-F2F2-4F3B-85BB-30FF1F953599"


def test_host_module_refuses_a_route_nic_group_with_its_code(tmp_path: Path) -> None:
    """The module goes through the same policy as `passthrough plan`: --include-group on the
    B550 chipset GPU would take the default-route NIC."""
    root = _root(tmp_path, "b550", "amd-b550-chipset")
    inv = _inventory(
        tmp_path,
        {
            "b550": {
                "passthrough_root": str(root),
                "passthrough_host_gpus": ["0000:2b:00.0"],
                "passthrough_host_include_group": True,
            }
        },
    )
    result = run(str(inv), "host.yml")
    assert not result.ok
    assert "[route-nic-in-group]" in (result.hosts["b550"].reason or ""), summary_table(result)
    assert not (root / "etc/modprobe.d/passthrough-vfio.conf").exists()


def test_sample_site_play_in_check_mode_counts_the_host_plan(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In check mode the host plan is not applied, so the vm role counts the cards that plan
    hands over (planned_functions) instead of refusing them as not handed over."""
    inventory = str(REPO / "inventory/sample/hosts.yml")
    assert main(["provision", "-i", inventory, "--sample", "--check", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["hosts"]["sample-hgx"]["changed"] == 2, report


def test_provision_input_errors_exit_2_before_ansible_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A missing inventory or an unknown playbook is the user's input (exit 2, one line),
    not Ansible failing underneath (4)."""
    assert main(["provision", "-i", str(tmp_path / "nope.yml")]) == 2
    assert main(["provision", "-i", str(tmp_path), "--playbook", "nope.yml"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "nope.yml: no such file or directory" in err[0] and "no playbook nope.yml" in err[1]
