# SPDX-License-Identifier: Apache-2.0
"""The newest complete apply's plan record, read from the journal: what verify checks and what a
new plan's selection keeps. Its own module, beside the journal, so that a plan that changes
nothing (the fleet's no-op) reads it without importing apply's machinery."""

from __future__ import annotations

from passthrough.actions import PlanRecord
from passthrough.host.root import HostRoot
from passthrough.journal.journal import Journal, TxKind, TxState


def last_applied(root: HostRoot) -> PlanRecord | None:
    """The plan record of the newest complete apply, for verify and a new plan's selection."""
    for tx in reversed(Journal.load(root).transactions):
        if tx.kind is TxKind.APPLY and tx.state is TxState.COMPLETE and tx.record:
            return tx.record
    return None
