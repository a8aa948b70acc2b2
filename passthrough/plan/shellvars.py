# SPDX-License-Identifier: Apache-2.0
"""Reading shell-sourced configuration (/etc/default/grub and its grub.d drop-ins) as the
shell does, for the few variables the planner cares about.

grub-mkconfig *sources* these files. We evaluate exactly what the shell would for our
variables — ``NAME=value`` with quotes, escapes and ``$NAME``/``${NAME}`` references to
them, ``export``, ``.``/``source`` of an absolute path (read from the same root) — and
refuse, with the file and line, anything whose effect on them we cannot prove: an
assignment inside ``if``/``case``/a loop/a function, ``eval``, a relative ``source``,
command substitution in their value, any other line that names them. Lines that only set
other variables (``GRUB_DISTRIBUTOR=`lsb_release …```) cannot change ours and are skipped.

Every character of a value carries where it was written (file and line), so an argument
we must remove is removed where the admin wrote it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from passthrough.plan.kargs import UnsafeCmdline

ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
OPENERS = {"if", "case", "for", "while", "until", "select", "{"}
CLOSERS = {"fi", "esac", "done", "}"}
MAX_SOURCE_DEPTH = 8
MAX_LINES = 20000


@dataclass(frozen=True)
class Origin:
    """Where a piece of a value was written: a file and its lines (first, last)."""

    path: str
    first: int
    last: int


Tagged = list[tuple[str, Origin | None]]  # a value, one origin per character


@dataclass
class ShellVars:
    """The variables ``names`` as the shell has them after sourcing files in order."""

    names: frozenset[str]
    values: dict[str, Tagged] = field(default_factory=dict)

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
        elif c == "\\" and i + 1 < n:
            out.append((raw[i + 1], here))
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


Reader = Callable[[str], str | None]  # an absolute path → its text (None: no such file)


def source(
    text: str, path: str, state: ShellVars, read: Reader | None = None, depth: int = 0
) -> None:
    """Update ``state`` as sourcing ``text`` (the file ``path``) would, or refuse."""
    if "\r" in text:
        raise UnsafeCmdline(
            path,
            "has CRLF line endings (grub-mkconfig would read them too): convert it with dos2unix",
        )
    lines = logical_lines(text, path)
    if len(lines) > MAX_LINES:
        raise UnsafeCmdline(path, f"has more than {MAX_LINES} lines")
    mention = re.compile(r"\b(" + "|".join(map(re.escape, sorted(state.names))) + r")\b")
    nesting = 0
    for first, last, code in lines:
        code = code.strip()
        where = f"{path}:{first}"
        if not code:
            continue
        words = re.split(r"[\s;]+", code)
        m = ASSIGN.match(code)
        if m is not None and m[1] in state.names:
            if nesting:
                raise UnsafeCmdline(
                    where,
                    f"sets {m[1]} inside a conditional, loop or function block: which value "
                    "the shell ends with is only known when it runs",
                )
            state.values[m[1]] = evaluate(m[2], state, where, Origin(path, first, last))
            continue
        if words[0] in (".", "source"):
            _source_line(words, state, where, read, depth, nesting)
            continue
        if words[0] == "eval":
            raise UnsafeCmdline(where, "uses eval, which can set any variable")
        if m is None:
            nesting += sum(w in OPENERS for w in words) - sum(w in CLOSERS for w in words)
            nesting = max(nesting, 0)
        if m is None and words[0] == "export" and all("=" not in w for w in words[1:]):
            continue  # marking a variable for export changes no value
        if mention.search(code):
            raise UnsafeCmdline(where, "sets the command line in a way the planner does not parse")


def _source_line(
    words: list[str], state: ShellVars, where: str, read: Reader | None, depth: int, nesting: int
) -> None:
    if len(words) != 2:
        raise UnsafeCmdline(where, "has a source line the planner does not parse")
    target = parse_value(words[1], {}, where)
    if nesting:
        raise UnsafeCmdline(where, f"sources {target} inside a block: whether it runs is unknown")
    if not target.startswith("/"):
        raise UnsafeCmdline(
            where,
            f"sources {target} by a relative name, looked up in a PATH the planner cannot know",
        )
    if depth >= MAX_SOURCE_DEPTH:
        raise UnsafeCmdline(where, f"sources files more than {MAX_SOURCE_DEPTH} deep")
    text = read(target) if read is not None else None
    if text is None:
        raise UnsafeCmdline(where, f"sources {target}, which this root does not have")
    source(text, target, state, read, depth + 1)


def read_assignments(text: str, path: str, names: Collection[str], known: dict[str, str]) -> None:
    """Source ``text`` for ``names`` (no ``source`` lines); ``known`` is updated as the
    shell's variables would be."""
    state = ShellVars(frozenset(names), {k: [(c, None) for c in known.get(k, "")] for k in names})
    source(text, path, state)
    known.update({k: state.value(k) for k in names})


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


@dataclass(frozen=True)
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
