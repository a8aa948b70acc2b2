# SPDX-License-Identifier: Apache-2.0
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
    # the hosts in the order given: host.yml's batches follow the inventory's order
    path.write_text(yaml.safe_dump(data, sort_keys=False))
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


def test_host_role_keeps_the_pages_an_earlier_apply_reserved_unless_told(tmp_path: Path) -> None:
    """The CLI's rule in the role: passthrough_host_hugepages left at its default (null)
    keeps the 1 GiB pages an earlier apply reserved (here the CLI's), 0 gives them back."""
    from passthrough.cli import main

    root = _root(tmp_path, "h", "consumer-intel")
    assert main(["apply", "--root", str(root), "--hugepages-1g", "8", "--yes", "-q"]) == 0
    dropin = root / "etc/default/grub.d/99-passthrough.cfg"
    assert "hugepages=8" in dropin.read_text()
    kept = run(str(_inventory(tmp_path, {"h": {"passthrough_root": str(root)}})), "host.yml")
    assert kept.ok and kept.hosts["h"].changed == 0, summary_table(kept)
    assert "hugepages=8" in dropin.read_text()
    inv = _inventory(
        tmp_path, {"h": {"passthrough_root": str(root), "passthrough_host_hugepages": 0}}
    )
    given_back = run(str(inv), "host.yml")
    assert given_back.ok and given_back.hosts["h"].changed >= 1, summary_table(given_back)
    assert "hugepage" not in dropin.read_text() and "vfio-pci.ids=" in dropin.read_text()


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
            # host.yml stops at the first batch with a failed host (tests/test_fleet_rolling.py);
            # this fleet lets every host of the batch run, to see each one's reason
            "-e",
            "passthrough_max_fail_percentage=100",
        ]
    )
    assert code == 4  # hosts failed under Ansible: EXIT_BACKEND, with --json as without
    report = json.loads(capsys.readouterr().out)
    hosts = report["hosts"]
    assert (
        hosts["good"]["status"] == "reboot pending"
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


@pytest.mark.usefixtures("libvirtd")
def test_vm_role_defines_on_a_real_libvirtd_idempotently(tmp_path: Path) -> None:
    """Defined, then nothing to do; a guest changed in the inventory shows as changed with
    the difference (--diff), check mode leaves the domain as it is, a real run redefines it,
    and then there is nothing to do again."""
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


def guest_manifests(tmp_path: Path, extravars: dict[str, Any]) -> Path:
    """The guest role's manifests, rendered by ansible-playbook (tag manifests) into a folder."""
    out = tmp_path / "manifests"
    inv = _inventory(tmp_path, {}, {"gpu-guest-1": {}})
    extravars = {**extravars, "passthrough_guest_k8s_manifest_dir": str(out)}
    result = run(str(inv), "guest.yml", tags="manifests", extravars=extravars)
    assert result.ok, summary_table(result)
    return out


@pytest.mark.parametrize("sharing", SHARING)
def test_kubernetes_manifests_validate_offline(sharing: str, tmp_path: Path) -> None:
    extravars = {
        "passthrough_guest_k8s_enabled": True,
        "passthrough_guest_gfd_enabled": True,
        "passthrough_guest_windows_directx": True,
        "passthrough_guest_sharing": sharing,
        "passthrough_guest_sharing_replicas": 8,
    }
    out = guest_manifests(tmp_path, extravars)
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
    # the DirectX plugin and its Job: tests/test_kube_guest_role.py
    job = yaml.safe_load((out / "windows-directx-workload.yaml").read_text())
    limits = job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"windows.alibabacloud.com/directx": "1"}


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


def _books(tmp_path: Path, tasks: list[dict[str, Any]], cfg: str = "") -> Path:
    """A playbooks folder of our own (PASSTHROUGH_PLAYBOOKS) with one play of ``tasks`` and
    an ansible.cfg setting a timeout of 31: what provision uses when the user has none."""
    books = tmp_path / "books"
    books.mkdir()
    play = [{"name": "t", "hosts": "all", "gather_facts": False, "tasks": tasks}]
    (books / "site.yml").write_text(yaml.safe_dump(play))
    (books / "ansible.cfg").write_text(cfg or "[defaults]\ntimeout = 31\n")
    return books


def test_provision_passes_every_extra_vars_form_and_verbosity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """-e k=v (two in one), -e @file (relative to where the user stands), -e JSON, all as
    ansible-playbook reads them; -vv reaches Ansible (its own output replaces ours)."""
    check = {"that": ["a == '1'", "b == 'two'", "c.d == 2", "e == 'x y'"]}
    monkeypatch.setenv("PASSTHROUGH_PLAYBOOKS", str(_books(tmp_path, [{"assert": check}])))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "vars.yml").write_text("c: {d: 2}\n")
    inv = _inventory(tmp_path, {"h": {}})
    argv = ["provision", "-i", str(inv), "--log", str(tmp_path / "l.log")]
    code = main([*argv, "-e", "a=1 b=two", "-e", "@vars.yml", "-e", '{"e": "x y"}', "-vv"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "h  changed" not in out and "All assertions passed" in err
    assert "config file = " in err  # -vv: ansible-playbook's own header
    assert main([*argv, "-e", "@missing.yml"]) == 2
    assert capsys.readouterr().err.strip().endswith("-e '@missing.yml': no such file")


def test_provision_uses_the_users_ansible_cfg_as_ansible_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """$ANSIBLE_CONFIG, then ./ansible.cfg where the user stands, else the playbooks' own;
    the repository's own sets no host_key_checking."""
    timeout = "{{ lookup('ansible.builtin.config', 'DEFAULT_TIMEOUT') }}"
    task = {"copy": {"content": timeout, "dest": str(tmp_path / "seen")}}
    monkeypatch.setenv("PASSTHROUGH_PLAYBOOKS", str(_books(tmp_path, [task])))
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ansible.cfg of the machine's user
    inv = _inventory(tmp_path, {"h": {}})
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    for cfg, want in ((None, "31"), ("23", "23"), ("17", "17")):
        if cfg == "23":
            (here / "ansible.cfg").write_text("[defaults]\ntimeout = 23\n")
        if cfg == "17":
            (tmp_path / "mine.cfg").write_text("[defaults]\ntimeout = 17\n")
            monkeypatch.setenv("ANSIBLE_CONFIG", str(tmp_path / "mine.cfg"))
        assert main(["provision", "-i", str(inv), "--log", str(tmp_path / "l.log")]) == 0
        assert (tmp_path / "seen").read_text() == want, capsys.readouterr()
    assert "host_key_checking" not in (PLAYBOOKS / "ansible.cfg").read_text()


def test_provision_flags_are_arguments_not_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--tags "x --list-hosts" is one tag (the task tagged so runs), and a quote in --limit
    names a host, not a traceback."""
    task = {"copy": {"content": "ran", "dest": str(tmp_path / "{{ inventory_hostname }}.ran")}}
    books = _books(tmp_path, [{**task, "tags": ["x --list-hosts"]}])
    monkeypatch.setenv("PASSTHROUGH_PLAYBOOKS", str(books))
    inv = _inventory(tmp_path, {"a'b": {}, "c": {}})
    log = ["--log", str(tmp_path / "l.log")]
    assert main(["provision", "-i", str(inv), "--tags", "x --list-hosts", *log]) == 0
    assert (tmp_path / "c.ran").exists()
    (tmp_path / "c.ran").unlink()
    assert main(["provision", "-i", str(inv), "--limit", "a'b", *log]) == 0
    assert (tmp_path / "a'b.ran").exists() and not (tmp_path / "c.ran").exists()
    assert main(["provision", "-i", str(inv), "--limit", 'nope"', *log]) == 4
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("passthrough: error: (playbook) failed")


def test_provision_check_diff_prints_diffs_and_reboot_per_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--check --diff prints the file diffs as ansible-playbook does (stdout), the summary
    says which host needs a reboot, and the run log is private (0600 in a 0700 folder)."""
    root = _root(tmp_path, "r", "consumer-intel")
    inv = _inventory(tmp_path, {"gpu-a": {"passthrough_root": str(root)}})
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".local/state/passthrough").mkdir(parents=True, mode=0o755)  # an older run's
    os.umask(old := os.umask(0))  # the caller's umask does not matter: 000 here
    try:
        argv = ["provision", "-i", str(inv), "--playbook", "host.yml"]
        assert main([*argv, "--check", "--diff"]) == 0
    finally:
        os.umask(old)
    out = capsys.readouterr().out
    log = Path(out.rsplit("full log: ", 1)[1].strip())
    assert "+++ after: /etc/default/grub.d/99-passthrough.cfg" in out, out
    assert "+for _passthrough_arg in vfio-pci.ids=" in out  # our appending line, as a diff
    assert "\\x0d" not in out  # a CR-LF line end of Ansible's is no escaped CR
    row = next(line for line in out.splitlines() if line.startswith("gpu-a"))
    assert row.split()[:3] == ["gpu-a", "would", "change"] and "required" in row.split()
    assert not (root / "etc/default/grub.d/99-passthrough.cfg").exists()
    assert log.stat().st_mode & 0o777 == 0o600 and log.parent.stat().st_mode & 0o777 == 0o700
    assert main(argv) == 0  # without --diff: no diff on stdout
    assert "+++ after" not in capsys.readouterr().out


def test_provision_says_what_the_sample_inventory_needs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PASSTHROUGH_SAMPLE_ROOT", raising=False)
    assert main(["provision", "-i", str(REPO / "inventory/sample/hosts.yml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "add --sample" in err[0] and "PASSTHROUGH_SAMPLE_ROOT" in err[0]


def test_playbooks_run_from_the_repository_root_and_from_anywhere(tmp_path: Path) -> None:
    """Ansible finds the collection beside the playbooks (playbooks/collections/) whatever
    the current directory, with no ansible.cfg; ansible-doc from the repository root."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["HOME"] = str(tmp_path)
    for cwd in (REPO, tmp_path):
        r = subprocess.run(
            [
                str(BIN / "ansible-playbook"),
                "--syntax-check",
                *("-i", str(REPO / "inventory/sample/hosts.yml"), str(PLAYBOOKS / "site.yml")),
            ],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=False,
            env=env,
        )
        assert r.returncode == 0, r.stdout + r.stderr
    doc = subprocess.run(
        [str(BIN / "ansible-doc"), "passthrough.gpu.passthrough_host"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    assert doc.returncode == 0 and "preflight" in doc.stdout and "not found" not in doc.stderr


def test_tasks_that_carry_secrets_keep_them_out_of_logs() -> None:
    roles = PLAYBOOKS / "ansible_collections/passthrough/gpu/roles"
    secret = ("join_command", "token", "password")
    seen = 0
    for path in roles.glob("*/tasks/*.yml"):
        for task in yaml.safe_load(path.read_text()) or []:
            # what a task runs or writes (a condition on a secret prints no value)
            acts = {k: v for k, v in task.items() if k not in ("name", "when", "tags")}
            if any(word in json.dumps(acts) for word in secret):
                seen += 1
                assert task.get("no_log") is True, (path.name, task.get("name"))
    assert seen >= 1  # the kubeadm join
