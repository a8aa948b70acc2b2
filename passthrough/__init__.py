# SPDX-License-Identifier: Apache-2.0
"""passthrough: GPU passthrough hosts, guests and the GPU containers inside them."""

__version__ = "0.1.0"
