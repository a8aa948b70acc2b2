# SPDX-License-Identifier: Apache-2.0
# Apache-2.0 (see the passthrough project's LICENSE)
"""Action for passthrough_guests: the module runs under the host's passthrough venv, installed first
where the host lacks the controller's version (plugin_utils/runtime.py)."""

from __future__ import annotations

from ansible_collections.passthrough.gpu.plugins.plugin_utils.runtime import (
    RuntimeAction as ActionModule,
)

__all__ = ["ActionModule"]
