# SPDX-License-Identifier: Apache-2.0
"""One policy, one verdict: for every card of every sample host, render refuses exactly
what scan refuses (and validate --host-root rejects), and tells exactly the warnings scan
gives that card; validate tells them again on what render wrote."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from passthrough import fakehost
from passthrough.analysis.policy import Refused, judge_all
from passthrough.host.discover import discover
from passthrough.model import Severity
from passthrough.vm.render import render
from passthrough.vm.spec import VmOptions, build_spec
from passthrough.vm.validate import validate_text

_CODE = re.compile(r"\[([a-z0-9-]+)\]$")


@pytest.mark.parametrize("name", fakehost.sample_names())
def test_render_and_validate_give_scans_verdict_on_every_card(
    name: str, hosts: dict[str, Path]
) -> None:
    host = discover(str(hosts[name]))
    verdicts = judge_all(host)
    for v in verdicts:
        errors = sorted({f.code for f in v.findings if f.severity is Severity.ERROR})
        warnings = sorted(f.code for f in v.findings if f.severity is Severity.WARNING)
        opts = VmOptions(name="verdict", gpus=(str(v.gpu.address),), memory_mib=4096)
        if errors:
            with pytest.raises(Refused) as exc:
                build_spec(host, opts)
            assert sorted(set(exc.value.codes)) == errors, v.gpu.address
            continue
        spec = build_spec(host, opts)
        # a large BAR scan warns about is what render's window holds: not warned again there,
        # and told by validate as info on what render wrote
        held = [c for c in warnings if c == "large-bar"]
        warnings = [c for c in warnings if c != "large-bar"]
        told = sorted(m[1] for w in spec.warnings if (m := _CODE.search(w)))
        assert told == warnings, v.gpu.address
        found = validate_text(render(spec).encode(), "verdict.xml", host)
        assert [f.code for f in found if f.severity is Severity.ERROR] == [], v.gpu.address
        host_warnings = sorted(
            f.code for f in found if f.severity is Severity.WARNING and f.layer == "host"
        )
        assert host_warnings == warnings, v.gpu.address
        infos = [f.code for f in found if f.severity is Severity.INFO and f.code == "large-bar"]
        assert infos == held, v.gpu.address


def test_render_tells_what_scan_warns_about(hosts: dict[str, Path]) -> None:
    """The warnings the issue found render silent on: ACS override, NVSwitch, Optimus."""
    cases = {
        "acs-override-proxmox": "acs-override",
        "hgx-h100": "nvswitch",
        "optimus-laptop": "laptop-3d",
    }
    for name, code in cases.items():
        host = discover(str(hosts[name]))
        viable = [v for v in judge_all(host) if v.viable and code in v.codes]
        assert viable, name
        opts = VmOptions(name="w", gpus=(str(viable[0].gpu.address),), memory_mib=4096)
        spec = build_spec(host, opts)
        assert any(w.endswith(f"[{code}]") for w in spec.warnings), (name, spec.warnings)
