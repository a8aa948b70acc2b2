# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""Action for passthrough_host: the task runs under the host's passthrough venv, installed first
where the host lacks the controller's version (plugin_utils/runtime.py); where the venv holds
it, as the library's own command (passthrough/hosttask.py) rather than through the module."""

from __future__ import annotations

from typing import Any

from ansible_collections.passthrough.gpu.plugins.plugin_utils.runtime import RuntimeAction


class ActionModule(RuntimeAction):
    direct = "passthrough.hosttask"

    @staticmethod
    def spec() -> dict[str, Any]:
        """The module's argument spec, read from the module itself."""
        from ansible_collections.passthrough.gpu.plugins.modules.passthrough_host import (
            argument_spec,
        )

        return argument_spec()
