#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: the readiness checks (passthrough check) as facts; never changes anything."""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_check
short_description: Readiness checks for GPU passthrough
description:
  - The checks of C(passthrough check) (IOMMU, kernel arguments, vfio-pci, each GPU's verdict)
    as facts, or with I(verify) the running host against the last apply. Changes nothing.
  - Needs the C(passthrough) Python package on the target.
options:
  root:
    description: Host root to read
    type: str
    default: /
  verify:
    description: Check the running host against the last apply instead
    type: bool
    default: false
extends_documentation_fragment: passthrough.gpu.runtime
author: passthrough developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Is this host ready for GPU passthrough?
  passthrough.gpu.passthrough_check:
  register: readiness

- name: After the reboot, is the running host what the last apply set up?
  passthrough.gpu.passthrough_check:
    verify: true
"""

RETURN = r"""
checks:
  description: every check with its id, level (pass, warn, fail), summary and fix
  returned: always
  type: list
  elements: dict
gpus:
  description: the GPUs and their verdicts as passthrough scan --json prints them (empty with verify)
  returned: always
  type: list
  elements: dict
failures:
  description: one line per failed check
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (Ansible wants DOCUMENTATION first)
from ansible_collections.passthrough.gpu.plugins.module_utils.package import (  # noqa: E402
    RUNTIME_OPTION,
    package_errors,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "str", "default": "/"},
            "verify": {"type": "bool", "default": False},
            **RUNTIME_OPTION,
        },
        supports_check_mode=True,
    )
    with package_errors(module):
        from passthrough.analysis.scan import analyse
        from passthrough.host.discover import discover
        from passthrough.host.root import HostRoot
        from passthrough.live.verify import verify
        from passthrough.model import Level
        from passthrough.output.json import scan_json

        host = discover(module.params["root"])
        if module.params["verify"]:
            results = verify(HostRoot(module.params["root"]), host)
            checks = [
                {"id": r.id, "level": r.level.value, "summary": r.summary, "fix": r.fix}
                for r in results
            ]
            gpus = []
        else:
            scan = analyse(host)
            data = scan_json(scan)
            checks, gpus = data["checks"], data["gpus"]
        failed = [c for c in checks if c["level"] == Level.FAIL.value]
        module.exit_json(
            changed=False,
            checks=checks,
            gpus=gpus,
            failures=[f"{c['id']}: {c['summary']}" for c in failed],
        )


if __name__ == "__main__":
    main()
