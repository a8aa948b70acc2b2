# SPDX-License-Identifier: Apache-2.0
"""Loader entries our journal does not know: written after apply, by a kernel update.

Where apply gave our arguments to the loader entries themselves (no /etc/kernel/cmdline),
a kernel installed later brings an entry of its own: copied from ``/proc/cmdline`` (so it
carries our words) or from a template (so it lacks them). ``status`` names both; ``undo``
takes our words out of those that carry them: it knows them from the journal (the
arguments each apply added), and it takes out exactly those words, nothing else.
"""

from __future__ import annotations

from passthrough.boot import loaderentries
from passthrough.host.root import HostRoot
from passthrough.journal.journal import StepState, Transaction
from passthrough.records import frozen


@frozen
class StrangeEntry:
    path: str  # relative to the root
    carries: list[str]  # words of ours it has (undo takes them out)
    lacks: list[str]  # arguments of the last apply it has not (an entry that can boot)


def _entries_applied(targets: list[Transaction]) -> set[str]:
    """The loader entries these transactions wrote (empty: they wrote none)."""
    return {
        s.path
        for tx in targets
        for s in tx.file_steps()
        if s.path is not None
        and s.state is not StepState.UNDONE
        and "/loader/entries/" in f"/{s.path}"
    }


def strangers(root: HostRoot, targets: list[Transaction]) -> list[StrangeEntry]:
    """Entries unknown to ``targets`` (live applies) that carry our words or, bootable,
    lack the last apply's arguments. Nothing when no apply wrote loader entries: then
    the entries are generated from /etc/kernel/cmdline, or another tool owns them."""
    known = _entries_applied(targets)
    if not known:
        return []
    ours = list(dict.fromkeys(a for tx in targets for a in tx.args_set))
    last = targets[-1].record
    wanted = list(last.kernel_args.set.values()) if last else ours
    out: list[StrangeEntry] = []
    for entry in loaderentries.all_entries(root):
        if entry.path in known:
            continue
        args = entry.arguments()
        carries = [a for a in ours if a in args]
        lacks = [a for a in wanted if a not in args] if loaderentries.installed(root, entry) else []
        if carries or lacks:
            out.append(StrangeEntry(entry.path, carries, lacks))
    return out
