# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""The option every module run under the collection's runtime takes from its action."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  runtime:
    description:
      - Set by the collection's action plugin, not in a playbook. The passthrough runtime the
        controller expects on the host (C(identity)), the venv holding it (C(venv)) and the
        Python modules the task needs there (C(requires)).
      - Where the venv holds another identity or lacks one of those modules, the module
        changes nothing and returns C(passthrough_runtime); the action then installs the
        controller's runtime and runs the module again.
    type: dict
"""
