# SPDX-License-Identifier: Apache-2.0
"""The fleet commands of docs/fleet.md, run as a new user runs them: from a venv made the way
`bash scripts/setup.sh demo` makes it (python3 -m venv, then `pip install -e .[libvirt]` with
the compat editable mode: ansible-core only, no kubernetes.core), not from the test venv, which
has the `ansible` package and so every collection. Before, the first documented command,
`passthrough provision -i inventory/sample/hosts.yml --sample`, failed after the canary:
couldn't resolve module/action 'kubernetes.core.k8s_drain'.

The venv is made once per checkout in the test cache (pip's cache makes it quick) and checked
to lack kubernetes.core, so the test proves what it claims."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from passthrough import fakehost

pytestmark = pytest.mark.fleet

REPO = Path(__file__).parents[1]
COMPAT = ["--config-settings", "editable_mode=compat"]  # as setup.sh installs it
# the demo's extra: it ends with `vm define`, and the guests' play imports libvirt
DEMO_EXTRA = "[libvirt]"
CACHE = Path(os.environ.get("PASSTHROUGH_TEST_CACHE", "/var/cache/passthrough-test"))


@pytest.fixture(scope="session")
def demo_venv() -> Path:
    """setup.sh demo's venv for this checkout (its editable install points here)."""
    setup = (REPO / "scripts/setup.sh").read_text()
    assert f'extra="{DEMO_EXTRA}"' in setup, "setup.sh demo installs another extra: follow it"
    install = ["-e", f"{REPO}{DEMO_EXTRA}", *COMPAT]
    key = hashlib.sha256(" ".join([str(REPO.resolve()), *install]).encode()).hexdigest()[:12]
    venv = CACHE / f"demo-venv-{key}"
    done = venv / "passthrough-demo-venv-ready"
    if not done.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin/python"), "-m", "pip", "install", "-q", *install],
            check=True,
            capture_output=True,
        )
        done.write_text("made as scripts/setup.sh demo makes .venv\n")
    probe = subprocess.run(
        [str(venv / "bin/python"), "-c", "import ansible_collections.kubernetes.core"],
        capture_output=True,
        check=False,
    )
    assert probe.returncode != 0, "the demo venv has kubernetes.core: it proves nothing"
    return venv


def _run(venv: Path, argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    environ["PATH"] = f"{venv / 'bin'}{os.pathsep}{environ.get('PATH', '')}"
    return subprocess.run(
        argv, cwd=REPO, env={**environ, **env}, capture_output=True, text=True, check=False
    )


def test_the_documented_sample_run_succeeds_and_says_what_it_did(
    demo_venv: Path, tmp_path: Path
) -> None:
    """site.yml on the sample: the host's files written, not rebooted ("reboot pending, not
    verified"), the canary's value said plainly, the policy's warnings once."""
    argv = ["passthrough", "provision", "-i", "inventory/sample/hosts.yml", "--sample"]
    r = _run(demo_venv, [*argv, "--log", str(tmp_path / "a.log")])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kubernetes.core" not in r.stdout + r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("sample-hgx"))
    assert "reboot pending" in row and "applied: reboot pending, not verified" in row
    assert "the canary proved the files only" in r.stdout
    assert r.stdout.count("[nvswitch]") == 1

    r = _run(demo_venv, [*argv, "--json", "--log", str(tmp_path / "b.log")])
    assert r.returncode == 0, r.stderr
    host = json.loads(r.stdout)["hosts"]["sample-hgx"]
    assert host["status"] == "reboot pending" and host["reboot_required"] is True
    assert [w[-len("[nvswitch]") :] for w in host["warnings"]].count("[nvswitch]") == 1


def test_the_documented_check_runs_succeed(demo_venv: Path, tmp_path: Path) -> None:
    """`passthrough provision ... --playbook host.yml --check --diff` and the same through
    ansible-playbook (PASSTHROUGH_SAMPLE_ROOT, as docs/fleet.md says) change nothing and show
    the diff; ansible-doc finds the role's module from the repository root."""
    argv = ["passthrough", "provision", "-i", "inventory/sample/hosts.yml", "--sample"]
    argv += ["--playbook", "host.yml", "--check", "--diff", "--log", str(tmp_path / "c.log")]
    r = _run(demo_venv, argv)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "+++ after: /etc/modprobe.d/passthrough-vfio.conf" in r.stdout
    row = next(line for line in r.stdout.splitlines() if line.startswith("sample-hgx"))
    assert "would change" in row

    root = fakehost.build(fakehost.load("hgx-h100"), tmp_path / "hgx")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    book = ["ansible-playbook", "-i", "inventory/sample/hosts.yml", "playbooks/host.yml"]
    r = _run(demo_venv, [*book, "--check", "--diff"], PASSTHROUGH_SAMPLE_ROOT=str(root))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before

    # plain ansible-playbook reads the play's settings from -e: a canary of 0 (which Ansible
    # would read as "every host at once") stops the play before its first task
    r = _run(demo_venv, [*book, "-e", "passthrough_canary=0"], PASSTHROUGH_SAMPLE_ROOT=str(root))
    assert r.returncode != 0 and "passthrough_canary: 0 is not a number of hosts" in r.stdout + (
        r.stderr
    )
    assert "TASK [" not in r.stdout
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before

    r = _run(demo_venv, ["ansible-doc", "passthrough.gpu.passthrough_host"])
    assert r.returncode == 0 and "passthrough_host" in r.stdout, r.stderr


def test_a_kubernetes_node_without_the_collection_is_named_in_one_line(
    demo_venv: Path, tmp_path: Path
) -> None:
    """Where a host names its Kubernetes node, the play needs kubernetes.core on the
    controller: the demo venv lacks it, so the host fails before anything changes, with one
    line naming the collection and how to install it."""
    argv = ["passthrough", "provision", "-i", "inventory/sample/hosts.yml", "--sample"]
    argv += ["--playbook", "host.yml", "--json", "--log", str(tmp_path / "k.log")]
    argv += ["-e", "passthrough_reboot_ok=true", "-e", "passthrough_host_k8s_node=gpu-node-07"]
    r = _run(demo_venv, argv)
    assert r.returncode == 4, r.stdout + r.stderr
    host = json.loads(r.stdout)["hosts"]["sample-hgx"]
    assert host["status"] == "failed"
    reason = host["reason"]
    assert "passthrough_host_k8s_node is gpu-node-07: the kubernetes.core collection is not" in (
        reason
    )
    assert "pip install ansible" in reason and "\n" not in reason
    assert "couldn't resolve module" not in r.stdout + r.stderr
