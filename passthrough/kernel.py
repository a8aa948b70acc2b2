# SPDX-License-Identifier: Apache-2.0
"""Kernel releases: the one place a release string becomes a comparable version."""

from __future__ import annotations

import re


def kernel_version(release: str | None) -> tuple[int, int] | None:
    """``6.8.0-45-generic`` → ``(6, 8)``; None when the release does not start with one."""
    m = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(m[1]), int(m[2])) if m else None
