# SPDX-License-Identifier: Apache-2.0
"""A finding's level in a check-style report (``check``, ``kubevirt preflight``): the one
severity the policy table gives its code (:mod:`passthrough.analysis.codes`), so the same
finding on the same host is a FAIL or a WARN alike in scan, check and preflight."""

from __future__ import annotations

from collections.abc import Collection

from passthrough.analysis import codes
from passthrough.model import Level

_LEVELS = {"error": Level.FAIL, "warning": Level.WARN, "info": Level.PASS}


def finding_level(code: str, overrides: Collection[str] = ()) -> Level:
    """FAIL for a refusal these flags do not lift, WARN for a warning, PASS for a note."""
    return _LEVELS[codes.severity(code, overrides)]
