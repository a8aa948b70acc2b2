# SPDX-License-Identifier: Apache-2.0
"""One shell value as the shell reads it: the variables of one evaluation (each character
tagged with where it was written), the bounds on what one evaluation may read in all, the
command lines of a file as the shell splits them, an assignment's right-hand side with
quotes, escapes and ``$NAME``/``${NAME}`` references evaluated; and the same value as a
list of words, written back so the shell reads those words (undo takes ours out of an
admin's line). shellvars.py sources whole files with it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from passthrough.kargs import UnsafeCmdline
from passthrough.records import frozen

ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
# one evaluation in all (a file sourced from a loop, each sourcing more): then refuse
MAX_TOTAL_LINES = 50000
MAX_FILES = 256
MAX_SECONDS = 5.0


@frozen
class Origin:
    """Where a piece of a value was written: a file and its lines (first, last)."""

    path: str
    first: int
    last: int


Tagged = list[tuple[str, Origin | None]]  # a value, one origin per character


@dataclass
class Budget:
    """What one evaluation may read in all, so a fan-out of sourced files stops early."""

    lines: int = MAX_TOTAL_LINES
    files: int = MAX_FILES
    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_SECONDS)

    def spend(self, where: str, lines: int = 0, files: int = 0) -> None:
        self.lines -= lines
        self.files -= files
        if self.lines < 0 or self.files < 0 or time.monotonic() > self.deadline:
            raise UnsafeCmdline(
                where,
                f"sourcing goes past {MAX_FILES} files, {MAX_TOTAL_LINES} lines or "
                f"{MAX_SECONDS:g} s in all, where the planner stops",
            )


Lister = Callable[[str], list[str]]  # an absolute directory → the names in it


@dataclass
class ShellVars:
    """The variables ``names`` as the shell has them after sourcing files in order."""

    names: frozenset[str]
    values: dict[str, Tagged] = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)
    listdir: Lister | None = None  # for a loop that sources every grub.d/*.cfg

    def value(self, name: str) -> str:
        return "".join(c for c, _ in self.values.get(name, []))

    def words(self, name: str) -> list[tuple[str, Origin | None]]:
        """The value split as the kernel line is: each word and where it was written
        (None when its characters came from more than one place)."""
        out: list[tuple[str, Origin | None]] = []
        word: Tagged = []
        for c, o in [*self.values.get(name, []), (" ", None)]:
            if c in " \t\n":
                if word:
                    origins = {x for _, x in word}
                    out.append(
                        ("".join(x for x, _ in word), origins.pop() if len(origins) == 1 else None)
                    )
                word = []
            else:
                word.append((c, o))
        return out


def logical_lines(text: str, path: str) -> list[tuple[int, int, str]]:
    """(first line, last line, code) for each command line as the shell splits them:
    backslash-newline joins, quotes and ``$(…)`` (quotes nest inside it) span lines,
    comments are dropped."""
    out: list[tuple[int, int, str]] = []
    buf: list[str] = []
    stack: list[str] = []  # open contexts: ' " ` and ( for $( or a nested (
    line = start = 1
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        nxt = text[i + 1] if i + 1 < n else ""
        top = stack[-1] if stack else ""
        i += 1
        if c == "\n":
            line += 1
            if not stack:
                out.append((start, line - 1, "".join(buf)))
                buf, start = [], line
                continue
        elif top == "'":
            if c == "'":
                stack.pop()
        elif c == "\\":
            if nxt == "\n":  # a continuation, also inside double quotes
                line += 1
            else:
                buf.append(c + nxt)
            i += 1
            continue
        elif c == "<" and nxt == "<" and top in ("", "("):
            # a here-document's body is text, not commands: read as lines it could hide
            # (or fake) an assignment, so it is refused where it starts
            raise UnsafeCmdline(
                f"{path}:{line}",
                "has a here-document (<<), whose text the planner does not read as the shell "
                "does; move it out of the GRUB files",
            )
        elif c == "$" and nxt == "(" and top in ("", "(", '"'):
            stack.append("(")
            buf.append("$(")
            i += 1
            continue
        elif top in ('"', "`"):
            if c == top:
                stack.pop()
        elif c in "'\"`":
            stack.append(c)
        elif c == "(" and top == "(":
            stack.append("(")
        elif c == ")" and top == "(":
            stack.pop()
        elif c == "#" and (not buf or buf[-1][-1:] in " \t;&|("):
            while i < n and text[i] != "\n":
                i += 1
            continue
        buf.append(c)
    if stack:
        raise UnsafeCmdline(f"{path}:{start}", f"unterminated {stack[-1]}")
    if buf:
        out.append((start, line, "".join(buf)))
    return out


def _expand(text: str, state: ShellVars, where: str, here: Origin) -> Tagged:
    def check(plain: str) -> None:
        if "`" in plain or "$(" in plain:
            raise UnsafeCmdline(where, "uses command substitution")
        if "$" in REF.sub("", plain):
            raise UnsafeCmdline(where, "has a $ the planner cannot evaluate")

    check(text)
    out: Tagged = []
    pos = 0
    for m in REF.finditer(text):
        out += [(c, here) for c in text[pos : m.start()]]
        name = m[1] or m[2]
        if name not in state.names:
            raise UnsafeCmdline(where, f"refers to ${name}, which the planner cannot evaluate")
        out += state.values.get(name, [])
        pos = m.end()
    out += [(c, here) for c in text[pos:]]
    return out


def evaluate(raw: str, state: ShellVars, where: str, here: Origin) -> Tagged:
    """The value of an assignment's right-hand side (one word, quotes removed)."""
    out: Tagged = []
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "'":
            end = raw.find("'", i + 1)
            if end < 0:
                raise UnsafeCmdline(where, "unterminated single quote")
            out += [(x, here) for x in raw[i + 1 : end]]
            i = end + 1
        elif c == '"':
            j = i + 1
            plain: list[str] = []
            while j < n and raw[j] != '"':
                if raw[j] == "\\" and j + 1 < n and raw[j + 1] in '"\\$`':
                    out += _expand("".join(plain), state, where, here)
                    plain = []
                    out.append((raw[j + 1], here))  # escaped: literal, never expanded
                    j += 2
                    continue
                plain.append(raw[j])
                j += 1
            if j >= n:
                raise UnsafeCmdline(where, "unterminated double quote")
            out += _expand("".join(plain), state, where, here)
            i = j + 1
        elif c == "\\":
            # a backslash escapes the next character; a final one (end of the file) stays
            out.append((raw[i + 1] if i + 1 < n else c, here))
            i += 2
        elif c in " \t":
            if raw[i:].strip():
                raise UnsafeCmdline(where, "has an unquoted space in the value")
            break
        elif c == "`":
            raise UnsafeCmdline(where, "uses command substitution")
        elif c in ";&|<>()":
            raise UnsafeCmdline(where, f"has shell syntax {c!r} the planner does not evaluate")
        else:
            j = i
            while j < n and raw[j] not in " \t'\"\\;&|<>()`":
                j += 1
            out += _expand(raw[i:j], state, where, here)
            i = j
    return out


def parse_value(raw: str, known: dict[str, str], where: str) -> str:
    """The value of a shell assignment's right-hand side, ``known`` giving the variables
    it may refer to."""
    state = ShellVars(frozenset(known), {k: [(c, None) for c in v] for k, v in known.items()})
    return "".join(c for c, _ in evaluate(raw, state, where, Origin(where, 0, 0)))


def quote(value: str) -> str:
    """Double-quoted for a shell file, escaping what the shell would interpret."""
    return '"' + re.sub(r'(["\\$`])', r"\\\1", value) + '"'


# -- rewriting a value word by word (undo takes our words out of an admin's line) --------

# A reference in a value being split into words stands as OPEN NAME CLOSE (private-use
# characters, refused where a line holds them itself): a word is then a string that
# compares equal to one of our arguments exactly when it is that argument, literally.
OPEN, CLOSE = "\ue000", "\ue001"
_MARKED = re.compile(OPEN + r"([A-Za-z_][A-Za-z0-9_]*)" + CLOSE)
_BARE_SAFE = re.compile(r"[A-Za-z0-9_=.,:/@%+-]+")


@frozen
class ValueWords:
    """A one-line ``NAME=value`` as the shell reads it: what stands before the value
    (indent, ``export``, ``NAME=``), how it was quoted (``"``, ``'`` or bare), the words of
    its value (references marked, see OPEN) and what follows it (spaces, a comment)."""

    head: str
    name: str
    quote: str
    words: tuple[str, ...]
    tail: str


def value_words(line: str) -> ValueWords | None:
    """The line as :class:`ValueWords`, or None where its value is not one the shell gives
    exactly from quotes, escapes and ``$NAME``/``${NAME}`` (command substitution, other
    expansions, a tilde, a second command, a line that goes on)."""
    if any(c in line for c in (OPEN, CLOSE, "~", "\n", "\r")):
        return None
    try:
        (code,) = [c for _f, _l, c in logical_lines(line, "")] or [""]
    except (UnsafeCmdline, ValueError):
        return None
    if not line.startswith(code):
        return None
    body = code.strip()
    lead = code[: len(code) - len(code.lstrip())]
    m = ASSIGN.match(body)
    if m is None:
        return None
    raw = m[2]
    names = {r[1] or r[2] for r in REF.finditer(raw)}
    state = ShellVars(frozenset(names), {n: [(c, None) for c in OPEN + n + CLOSE] for n in names})
    try:
        value = "".join(c for c, _ in evaluate(raw, state, "", Origin("", 0, 0)))
    except UnsafeCmdline:
        return None
    quote_char = raw[:1] if raw[:1] in ("'", '"') else ""
    head = lead + body[: len(body) - len(raw)]
    # split where the shell's IFS would (not str.split's every Unicode space: a word of the
    # admin's holding one must stay one word)
    words = tuple(w for w in re.split(r"[ \t\n]+", value) if w)
    return ValueWords(head, m[1], quote_char, words, line[len(lead + body) :])


def render_value(words: tuple[str, ...] | list[str], quote_char: str) -> str:
    """The value the shell reads as ``words`` joined by single spaces, in the quoting asked
    for where it can hold them (one plain word bare, plain words in single quotes), in
    double quotes otherwise, references as ``${NAME}``."""
    text = " ".join(words)
    plain = OPEN not in text
    if (
        quote_char == ""
        and plain
        and (not text or (len(words) == 1 and _BARE_SAFE.fullmatch(text)))
    ):
        return text
    if quote_char == "'" and plain and "'" not in text:
        return f"'{text}'"
    body = re.sub(r'(["\\$`])', r"\\\1", text)
    return '"' + _MARKED.sub(lambda r: "${" + r[1] + "}", body) + '"'
