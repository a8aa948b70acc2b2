# SPDX-License-Identifier: Apache-2.0
"""What a prepared host costs in host.yml's no-op run (issue 32, docs/fleet.md "Cost at scale"):
one module call and nothing else run by a worker; the role's argument check inside that call;
a library import that leaves apply's machinery out; the controller's identity of the library
hashed once, not once per host.

Real ansible-playbook (through ``passthrough provision``'s runner) over sample host roots with
the local connection, as tests/test_ansible.py runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from passthrough.provision.runner import run, summary_table
from tests.test_ansible import _inventory, _root

REPO = Path(__file__).parents[1]
DROPIN = "etc/modprobe.d/passthrough-vfio.conf"


@pytest.mark.fleet
def test_a_prepared_host_costs_one_module_call(tmp_path: Path) -> None:
    """The second run changes nothing and each host runs one task in a worker besides the
    batch's line (ok 2, nothing skipped): no argument-check task, no skipped include, whether
    the play may reboot or not. A bad value still stops its host, naming the variable, with
    nothing changed; the others go on."""
    hosts = {
        f"h{i}": {"passthrough_root": str(_root(tmp_path, f"h{i}", "consumer-intel"))}
        for i in range(2)
    }
    inv = _inventory(tmp_path, hosts)
    first = run(str(inv), "host.yml")
    assert first.ok and all(h.changed == 1 for h in first.hosts.values()), summary_table(first)
    for extravars in ({}, {"passthrough_reboot_ok": True, "passthrough_vm_uri": ""}):
        log = tmp_path / f"noop-{len(extravars)}.log"
        again = run(str(inv), "host.yml", extravars=extravars, log_path=str(log))
        assert again.ok, summary_table(again)
        for h in again.hosts.values():
            assert (h.ok, h.changed, h.skipped) == (2, 0, 0), summary_table(again)
        assert "Validating arguments" not in log.read_text()
    # a bad value given to the role's variable, and one reaching it through the role's
    # default template ("{{ passthrough_reboot_ok | default(false) }}"): both checked
    bad = _root(tmp_path, "bad", "consumer-intel")
    via = _root(tmp_path, "via", "consumer-intel")
    inv = _inventory(
        tmp_path,
        {
            **hosts,
            "bad": {"passthrough_root": str(bad), "passthrough_host_reboot_ok": "maybe"},
            "via": {"passthrough_root": str(via), "passthrough_reboot_ok": "perhaps"},
        },
    )
    mixed = run(str(inv), "host.yml", extravars={"passthrough_max_fail_percentage": 100})
    for name, root, said in (("bad", bad, "'maybe'"), ("via", via, "'perhaps'")):
        reason = mixed.hosts[name].reason or ""
        assert mixed.hosts[name].failed and "passthrough_host_reboot_ok" in reason, reason
        assert "is not a valid boolean" in reason and said in reason, reason
        assert not (root / DROPIN).exists()
    assert all(mixed.hosts[n].failed == 0 for n in hosts), summary_table(mixed)


def test_planning_on_a_prepared_host_leaves_apply_out() -> None:
    """What the host module imports to find that nothing is to do: the journal (the earlier
    apply's cards), not apply's machinery (sandbox, file writing, the steps)."""
    probe = (
        "import sys; import passthrough.journal.selection, passthrough.host.discover, "
        "passthrough.plan.build, passthrough.plan.options; "
        "print(*sorted(m for m in sys.modules if m.startswith('passthrough.journal')))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env
    ).stdout
    loaded = out.split()
    assert "passthrough.journal.journal" in loaded
    assert not {"passthrough.journal.apply", "passthrough.journal.sandbox"} & set(loaded), loaded


def test_the_library_identity_is_hashed_again_only_when_a_file_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity of a checkout is cached under its files' names, sizes and times: asked
    again it is the same without reading them; a file rewritten with other bytes of the same
    size gives another identity, and the first one back when restored."""
    sys.path.insert(0, str(REPO / "playbooks"))
    from ansible_collections.passthrough.gpu.plugins.plugin_utils import wheel as runtime

    repo = tmp_path / "checkout"
    (repo / "passthrough").mkdir(parents=True)
    (repo / "templates").mkdir()
    (repo / "pyproject.toml").write_text("[project]\n")
    (repo / "passthrough/__init__.py").write_text('__version__ = "9.9"\n')
    module = repo / "passthrough/mod.py"
    module.write_text("A = 1\n")
    monkeypatch.setattr(runtime, "_checkout", lambda: repo)
    monkeypatch.setattr(runtime, "CACHE", tmp_path / "cache/passthrough/wheels")
    first = runtime.identity()
    assert first.startswith("9.9+") and runtime.identity() == first
    assert len(list((tmp_path / "cache/passthrough/identity").iterdir())) == 1
    module.write_text("A = 2\n")  # same size, other bytes
    assert runtime.identity() not in ("", first)
    module.write_text("A = 1\n")
    assert runtime.identity() == first


def test_what_every_worker_works_out_alike_is_worked_out_once_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The identity and the role's argument specs: kept in the run's own local temporary
    directory (each host's task is a worker process), worked out again in another run; and
    worked out each time where Ansible gave no such directory."""
    sys.path.insert(0, str(REPO / "playbooks"))
    from ansible import constants as C
    from ansible_collections.passthrough.gpu.plugins.plugin_utils import runtime

    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        return f"answer {len(calls)}"

    run_dir = tmp_path / "ansible-local-1"
    run_dir.mkdir()
    monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(run_dir), raising=False)
    assert runtime.per_run("x", compute) == "answer 1"
    assert runtime.per_run("x", compute) == "answer 1" and len(calls) == 1
    assert runtime.per_run("y", compute) == "answer 2"  # another name, its own answer
    other = tmp_path / "ansible-local-2"  # the next run
    other.mkdir()
    monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(other))
    assert runtime.per_run("x", compute) == "answer 3"
    monkeypatch.setattr(C, "DEFAULT_LOCAL_TMP", str(tmp_path / "gone"))
    assert runtime.per_run("x", compute) == "answer 4"
    assert runtime.per_run("x", compute) == "answer 5"
