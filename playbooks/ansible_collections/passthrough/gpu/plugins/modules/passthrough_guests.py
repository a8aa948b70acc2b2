#!/usr/bin/python
# SPDX-License-Identifier: Apache-2.0
"""Ansible module: the libvirt guests that hold a host's cards (passthrough.vm.guests)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: passthrough_guests
short_description: Find, stop or start the libvirt guests that hold a host's cards
description:
  - A guest holds a card where its domain has a PCI hostdev whose source is one of the card's
    functions. The host role reads them before a reboot and, as the user chose, refuses or
    stops them, then starts them again after the host is verified.
  - Needs the C(passthrough) Python package and libvirt-python on the target.
options:
  uri:
    description: libvirt connection URI
    type: str
    default: qemu:///system
  functions:
    description: PCI addresses of the card functions (the host plan's C(functions))
    type: list
    elements: str
    default: []
  state:
    description:
      - query lists the holders; stopped shuts the running holders down (and fails naming
        those still running after I(timeout)); started starts the I(names) not running
    type: str
    choices: [query, stopped, started]
    default: query
  names:
    description: for I(state=started), the guests to start (those I(state=stopped) stopped)
    type: list
    elements: str
    default: []
  timeout:
    description: seconds to wait for the guests to shut down
    type: int
    default: 300
extends_documentation_fragment: passthrough.gpu.runtime
author: passthrough developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Stop the guests that hold the cards
  passthrough.gpu.passthrough_guests:
    functions: ["0000:18:00.0"]
    state: stopped
  register: stopped
"""

RETURN = r"""
holders:
  description: the guests holding one of the functions (name, active, functions)
  returned: always
  type: list
  elements: dict
stopped:
  description: the guests this call shut down
  returned: always
  type: list
  elements: str
started:
  description: the guests this call started
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.passthrough.gpu.plugins.module_utils.package import (  # noqa: E402
    RUNTIME_OPTION,
    package_errors,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "uri": {"type": "str", "default": "qemu:///system"},
            "functions": {"type": "list", "elements": "str", "default": []},
            "state": {
                "type": "str",
                "choices": ["query", "stopped", "started"],
                "default": "query",
            },
            "names": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "int", "default": 300},
            **RUNTIME_OPTION,
        },
        supports_check_mode=True,
    )
    with package_errors(module):
        import libvirt

        from passthrough.vm import guests

        p = module.params
        try:
            conn = libvirt.open(p["uri"])
        except libvirt.libvirtError as exc:
            module.fail_json(msg=f"libvirt {p['uri']}: {exc.get_error_message()}")
        try:
            found = guests.holders(conn, p["functions"])
            running = [h.name for h in found if h.active]
            stopped: list[str] = []
            started: list[str] = []
            if p["state"] == "stopped" and not module.check_mode:
                stopped = guests.stop(conn, running, p["timeout"])
            if p["state"] == "started" and not module.check_mode:
                started = guests.start(conn, p["names"])
        finally:
            conn.close()
        would = running if p["state"] == "stopped" else []
        module.exit_json(
            changed=bool(stopped or started or (module.check_mode and would)),
            holders=[h.to_json() for h in found],
            stopped=stopped,
            started=started,
        )


if __name__ == "__main__":
    main()
