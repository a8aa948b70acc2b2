# SPDX-License-Identifier: Apache-2.0
"""Undo takes out only our words: a three-way merge of a file edited in place.

Apply turned ``original`` into ``written``; since then someone turned ``written`` into
``current`` (an admin adding ``nomodeset`` to the kernel line we appended to). Undo wants
``current`` with apply's change reversed and the admin's kept. Both are changes to the same
base (``written``): apply's reversal (``written`` → ``original``) and the admin's
(``written`` → ``current``). Where they touch different lines, both are made. Where both
changed the same line and that line is a list of words (a kernel command line, a loader
entry's ``options`` line, a shell assignment such as ``GRUB_CMDLINE_LINUX="…"`` or
``MODULES=(…)``), the same merge runs on its words: our words come out, words we removed
go back where they were, the admin's stay. Anything else (the admin changed or removed one
of our words, or inserted beside a word we put back in the same place) is refused: the
caller stops and names the file.

Pure functions on text; the spacing between words on a merged line becomes one space.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from passthrough.boot.linefiles import cmdline_arg_line, options_line
from passthrough.boot.shellvalue import CLOSE, OPEN, render_value, value_words
from passthrough.boot.shellvars import LoopLine, loop_line
from passthrough.journal.drift import CMDLINE_FILES, Ambiguous, Unpicked
from passthrough.records import frozen

T = TypeVar("T")
Resolve = Callable[[T, T, T], T | None]
Alike = Callable[[T, T], bool]

_NAME = re.compile(r"\s*(?:export\s+)?[A-Za-z_][A-Za-z0-9_]*=")
_UNSAFE = re.compile(r"[\\`]|\$\(")  # what a word list cannot be taken apart through


@frozen
class _Hunk(Generic[T]):
    """``base[start:end]`` becomes ``items``."""

    start: int
    end: int
    items: tuple[T, ...]


def _hunks(base: Sequence[T], other: Sequence[T], alike: Alike[T] | None) -> list[_Hunk[T]]:
    matcher = difflib.SequenceMatcher(None, base, other, autojunk=False)
    out: list[_Hunk[T]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "replace" and alike is not None:
            out += _paired(base, other, (i1, i2, j1, j2), alike)
        elif tag != "equal":
            out.append(_Hunk(i1, i2, tuple(other[j1:j2])))
    return out


def _paired(
    base: Sequence[T], other: Sequence[T], block: tuple[int, int, int, int], alike: Alike[T]
) -> list[_Hunk[T]]:
    """A block of changed lines as one hunk per line changed in place (a line paired with
    the next one like it); what lies between the pairs stays one hunk, replaced whole."""
    i1, i2, j1, j2 = block
    pairs: list[tuple[int, int]] = []
    j = j1
    for i in range(i1, i2):
        k = next((k for k in range(j, j2) if alike(base[i], other[k])), None)
        if k is not None:
            pairs.append((i, k))
            j = k + 1
    out: list[_Hunk[T]] = []
    at, to = i1, j1
    for i, k in [*pairs, (i2, j2)]:
        if at < i or to < k:
            out.append(_Hunk(at, i, tuple(other[to:k])))
        if i < i2:
            out.append(_Hunk(i, i + 1, (other[k],)))
        at, to = i + 1, k + 1
    return out


def _clash(a: _Hunk[T], b: _Hunk[T]) -> bool:
    if a.start == a.end and b.start == b.end:
        return a.start == b.start  # two insertions at one place: which goes first?
    return a.start < b.end and b.start < a.end


def merge(
    base: Sequence[T],
    ours: Sequence[T],
    theirs: Sequence[T],
    resolve: Resolve[T] | None = None,
    alike: Alike[T] | None = None,
    keep_inserts: bool = False,
) -> list[T] | None:
    """``base`` with both changes made, None where they collide. ``resolve`` may settle a
    collision where both replaced the same items one for one, item by item; ``alike`` says
    which items in a changed block are one item changed (paired before the merge).
    ``keep_inserts``: where ours only deletes a run of items and theirs only inserts
    inside it, the run goes and their items stay (our words out of a list the admin
    added to in the middle)."""
    mine, yours = _hunks(base, ours, alike), _hunks(base, theirs, alike)
    chosen = [h for h in mine if not any(_clash(h, y) for y in yours)]
    chosen += [y for y in yours if not any(_clash(h, y) for h in mine)]
    for h in mine:
        hit = [y for y in yours if _clash(h, y)]
        if not hit:
            continue
        inside = all(y.start == y.end and h.start < y.start < h.end for y in hit)
        if keep_inserts and not h.items and inside:
            at = h.start
            for y in sorted(hit, key=lambda y: y.start):
                chosen += [_Hunk(at, y.start, ()), y]
                at = y.start
            chosen.append(_Hunk(at, h.end, ()))
            continue
        y = hit[0]
        if len(hit) > 1 or sum(_clash(x, y) for x in mine) > 1:
            return None
        if y == h:
            chosen.append(h)
            continue
        settled = _settle(base, h, y, resolve)
        if settled is None:
            return None
        chosen.append(settled)
    out: list[T] = []
    at = 0
    # an insertion at a place where the other side replaced goes before the replacement
    for h in sorted(chosen, key=lambda h: (h.start, h.end != h.start)):
        out.extend(base[at : h.start])
        out.extend(h.items)
        at = h.end
    out.extend(base[at:])
    return out


def _settle(
    base: Sequence[T], h: _Hunk[T], y: _Hunk[T], resolve: Resolve[T] | None
) -> _Hunk[T] | None:
    """Both sides replaced the same items one for one: ``resolve`` merges them pairwise."""
    n = h.end - h.start
    if (
        resolve is None
        or (y.start, y.end) != (h.start, h.end)
        or not n == len(h.items) == len(y.items)
    ):
        return None
    merged: list[T] = []
    for b, o, t in zip(base[h.start : h.end], h.items, y.items, strict=True):
        m = resolve(b, o, t)
        if m is None:
            return None
        merged.append(m)
    return _Hunk(h.start, h.end, tuple(merged))


# -- lines that are lists of words --------------------------------------------------------


@frozen
class _Words:
    head: str  # everything before the value: "options ", "GRUB_CMDLINE_LINUX=", "MODULES=("
    words: tuple[str, ...]
    tail: str  # everything after it: ")", a comment
    quote: str | None = None  # a shell value's quoting ('"', "'", ""); None: words as they are
    # our appending GRUB line: its words are the variable it appends to (as a reference,
    # first), then the words it lists, so that it merges with an admin's assignment
    # ``GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} …"`` put in its place
    loop: LoopLine | None = None

    def render(self, words: Sequence[str], quote: str | None) -> str:
        if quote is None:
            return self.head + " ".join(words) + self.tail
        return self.head + render_value(tuple(words), quote) + self.tail


def _ref(name: str) -> str:
    return OPEN + name + CLOSE  # a reference, as shellvalue.value_words marks it


def _adds_nothing(w: _Words | None) -> bool:
    return w is not None and w.words == (_ref(_name(w)),)


def _loop(line: str) -> _Words | None:
    if (found := loop_line(line)) is None:
        return None
    return _Words(found.head, (_ref(found.target), *found.words), found.tail, loop=found)


def _render_loop(loop: LoopLine, words: Sequence[str]) -> str | None:
    """The loop line appending ``words[1:]`` (None: the words do not start with its
    variable, or hold another reference: no loop line means them)."""
    if not words or words[0] != _ref(loop.target) or any(OPEN in w for w in words[1:]):
        return None
    return loop.render(words[1:])


def _array(line: str) -> _Words | None:
    """``NAME=(a b)``, a comment after it: each word an element as written."""
    m = _NAME.match(line)
    if not m or line[m.end() : m.end() + 1] != "(":
        return None
    rest = line[m.end() :]
    end = rest.find(")", 1)
    if end < 0:
        return None
    inner, after = rest[1:end], rest[end + 1 :]
    if '"' in inner or "'" in inner or _UNSAFE.search(inner):
        return None
    if after.strip() and not after.lstrip().startswith("#"):
        return None  # a second command on the line
    return _Words(m.group(0) + "(", tuple(inner.split()), ")" + after)


def _assignment(line: str) -> _Words | None:
    """An array as written, our appending GRUB line, or a one-line assignment as the shell
    reads its value: words compared by what they mean, not how they are quoted
    (shellvalue.value_words)."""
    found = _array(line) or _loop(line)
    if found is not None:
        return found
    value = value_words(line)
    if value is None:
        return None
    return _Words(value.head, value.words, value.tail, value.quote)


def _words(path: str, line: str) -> _Words | None:
    """The line as a list of words, in the form this file holds them (None: it is not)."""
    if path in CMDLINE_FILES:
        if not cmdline_arg_line(line):
            return None
        lead = line[: len(line) - len(line.lstrip())]
        return _Words(lead, tuple(line.split()), "")
    if "/loader/entries/" in f"/{path}":
        if not options_line(line):
            return None
        body = line[len("options") :]
        lead = "options" + body[: len(body) - len(body.lstrip())]
        return _Words(lead, tuple(body.split()), "")
    return _assignment(line)


def _name(w: _Words) -> str:
    return w.loop.target if w.loop is not None else w.head.split("=")[0].strip()


def _same(a: _Words, b: _Words) -> bool:
    """One list of words changed: the same name, or our loop line and an assignment to a
    variable it reads."""
    if _name(a) == _name(b):
        return True
    return any(
        x.loop is not None and _name(y) in x.loop.scope and y.loop is None
        for x, y in ((a, b), (b, a))
    )


def _word_resolver(path: str) -> Resolve[str]:
    def resolve(base: str, ours: str, theirs: str) -> str | None:
        b, o, t = (_words(path, x) for x in (base, ours, theirs))
        if b is None or o is None or t is None or not (_same(b, o) and _same(b, t)):
            return None
        loop = b.loop is not None or o.loop is not None or t.loop is not None
        words = merge(b.words, o.words, t.words, keep_inserts=loop)
        if words is None:
            return None
        if loop or o.loop is not None or t.loop is not None:
            # the form of the admin's line if they changed it, else the one going back
            form = o if (t.head, t.tail, t.quote) == (b.head, b.tail, b.quote) else t
            if form.loop is not None:
                return _render_loop(form.loop, words)
            return _Words(form.head, (), form.tail).render(words, form.quote)
        # what frames the words goes back too, unless the admin changed it
        head = o.head if t.head == b.head else t.head
        tail = o.tail if t.tail == b.tail else t.tail
        quote = o.quote if t.quote == b.quote else t.quote
        return _Words(head, (), tail).render(words, quote)

    return resolve


def _alike(path: str) -> Alike[str]:
    """Two lines are one line changed when both are word lists of one name (the same
    variable, both ``options`` lines, both command lines; our loop line and an assignment
    to a variable it reads)."""

    def alike(a: str, b: str) -> bool:
        wa, wb = _words(path, a), _words(path, b)
        return wa is not None and wb is not None and _same(wa, wb)

    return alike


def _with_empty_loop(path: str, original: list[str], written: list[str]) -> list[str]:
    """``original`` with our loop line, listing nothing, where apply added the line:
    taking the line out is then taking its words out (docs/safety.md)."""
    loops = [(i, w) for i, line in enumerate(written) if (w := _loop(line)) is not None]
    if _word_lines(path) is not None or len(loops) != 1:
        return original
    i, ours = loops[0]
    found = [w for line in original if (w := _words(path, line)) is not None]
    if ours.loop is None or any(_same(ours, w) for w in found):
        return original
    matcher = difflib.SequenceMatcher(None, written, original, autojunk=False)
    for _tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if i1 <= i < i2:
            at = j1 + min(i - i1, j2 - j1)
            return [*original[:at], ours.loop.render([]), *original[at:]]
    return original


# -- files whose lines together are one word list ----------------------------------------


def _word_lines(path: str) -> Callable[[str], bool] | None:
    """Which lines of ``path`` together make one list of words, read as one (None: the
    file is not such a list): kernel-install joins the lines of /etc/kernel/cmdline,
    systemd-boot the ``options`` lines of a loader entry."""
    if path in CMDLINE_FILES:
        return cmdline_arg_line
    if "/loader/entries/" in f"/{path}":
        return options_line
    return None


def _all_words(path: str, is_arg: Callable[[str], bool], lines: list[str]) -> list[str]:
    return [w for line in lines if is_arg(line) for w in _line_words(path, line)]


def _line_words(path: str, line: str) -> tuple[str, ...]:
    found = _words(path, line)
    return found.words if found is not None else ()


def _every_line(
    path: str,
    is_arg: Callable[[str], bool],
    texts: tuple[list[str], list[str], list[str]],
    merged: list[str] | None,
) -> list[str] | None:
    """The line merge ``merged`` with our words out of every line: the file's whole word
    list must be the merge of the three word lists (the admin may have split the line, and
    the line merge only took ours out of the line it paired, or failed on it: then the
    admin's file, where apply changed only words). Words of ours left over are taken from
    the last lines first; anything else left over (or a merge that collides): None."""
    original, written, current = (_all_words(path, is_arg, t) for t in texts)
    want = merge(written, original, current)
    if want is None:
        return None
    out = merged
    if out is None:
        others = [[line for line in t if not is_arg(line)] for t in texts[:2]]
        if others[0] != others[1]:
            return None
        out = texts[2]
    extra = Counter(_all_words(path, is_arg, out)) - Counter(want)
    ours = Counter(written) - Counter(original)
    if any(ours[w] < n for w, n in extra.items()):
        return None
    fixed: list[str | None] = list(out)
    for i in reversed(range(len(out))):
        found = _words(path, out[i]) if is_arg(out[i]) else None
        if found is None or not extra:
            continue
        kept = list(found.words)
        for j in reversed(range(len(kept))):
            if extra[kept[j]] > 0:
                extra[kept[j]] -= 1
                del kept[j]
        if kept != list(found.words):
            fixed[i] = found.render(kept, None) if kept else None  # a line of only ours goes
    done = [line for line in fixed if line is not None]
    return done if _all_words(path, is_arg, done) == want else None


def take_back(path: str, original: bytes, written: bytes, current: bytes) -> Unpicked | Ambiguous:
    """``current`` without apply's change from ``original`` to ``written`` (see the module's
    docstring); ``Unpicked(None)``: apply created the file and nothing of anyone else's is
    left in it."""
    try:
        orig_l = original.decode().split("\n")
        wrote_l = written.decode().split("\n")
        cur_l = current.decode().split("\n")
    except UnicodeDecodeError:
        return Ambiguous("not text")
    base = _with_empty_loop(path, orig_l, wrote_l)
    out = merge(wrote_l, base, cur_l, _word_resolver(path), _alike(path))
    if out is not None and base is not orig_l:
        # a line that adds nothing (a loop listing nothing, NAME="${NAME}") goes
        out = [x for x in out if x in cur_l or not _adds_nothing(_words(path, x))]
    is_arg = _word_lines(path)
    if is_arg is not None:
        out = _every_line(path, is_arg, (orig_l, wrote_l, cur_l), out)
    if out is None:
        return Ambiguous("changed since apply where apply changed it")
    if not original and not any(line.strip() for line in out):
        return Unpicked(None)
    return Unpicked("\n".join(out).encode())
