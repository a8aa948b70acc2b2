#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: cards to vfio now (passthrough bind) or back to their host drivers now
(passthrough release), until reboot, journaled as the CLI journals them."""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_live_driver
short_description: Move GPUs between vfio and their host drivers now, without a reboot
description:
  - With I(state=vfio) the cards' functions go to their vfio driver as C(passthrough bind)
    moves them; with I(state=host) they go back to the host driver they had before, or the
    kernel's default, as C(passthrough release) does. One function at a time, each confirmed
    by the kernel's bind event, noted in C(/var/lib/passthrough/live-drivers.json).
  - Refuses a card that a process or a guest holds open, naming the holder. Not persistent
    (C(passthrough_host) makes the vfio binding survive a reboot). Check mode moves nothing
    and reports what would move.
  - Needs the C(passthrough) Python package and pyudev on the target.
options:
  root:
    description: Host root (moving drivers works on the live host only)
    type: str
    default: /
  gpus:
    description: The cards (PCI addresses or vendor:device IDs); default every NVIDIA card
    type: list
    elements: str
    default: []
  state:
    description: vfio (bind) or host (release)
    type: str
    choices: [vfio, host]
    default: vfio
  timeout:
    description: Seconds to wait for each bind event
    type: float
    default: 10.0
author: passthrough developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Give the card back to the host's driver for a container job
  passthrough.gpu.passthrough_live_driver:
    gpus: ["0000:01:00.0"]
    state: host

- name: And to vfio again for the guest
  passthrough.gpu.passthrough_live_driver:
    gpus: ["0000:01:00.0"]
    state: vfio
"""

RETURN = r"""
moved:
  description: address to the driver each moved function is on now
  returned: always
  type: dict
planned:
  description: address to the driver each function goes to (null - the kernel's default)
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402 (Ansible wants DOCUMENTATION first)
from ansible_collections.passthrough.gpu.plugins.module_utils.package import package_errors  # noqa: E402


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "str", "default": "/"},
            "gpus": {"type": "list", "elements": "str", "default": []},
            "state": {"type": "str", "choices": ["vfio", "host"], "default": "vfio"},
            "timeout": {"type": "float", "default": 10.0},
        },
        supports_check_mode=True,
    )
    with package_errors(module):
        from passthrough.errors import PassthroughError
        from passthrough.live.live import live_move

        try:
            planned, moved = live_move(
                module.params["root"],
                module.params["gpus"],
                module.params["state"],
                module.params["timeout"],
                check=module.check_mode,
            )
        except PassthroughError as exc:
            module.fail_json(msg=str(exc))
        module.exit_json(changed=bool(planned), planned=planned, moved=moved)


if __name__ == "__main__":
    main()
