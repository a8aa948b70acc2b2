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
import shlex
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from passthrough.plan.kargs import UnsafeCmdline

ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
REF = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
OPENERS = {"if", "case", "for", "while", "until", "select", "{"}
CLOSERS = {"fi", "esac", "done", "}"}
MAX_SOURCE_DEPTH = 8
MAX_LINES = 20000
# one evaluation in all (a file sourced from a loop, each sourcing more): then refuse
MAX_TOTAL_LINES = 50000
MAX_FILES = 256
MAX_SECONDS = 5.0
# builtins that set a variable named by their arguments or by text they read: whatever
# they set, the planner cannot see it (printf only with -v)
SETTERS = {"eval", "read", "declare", "typeset", "local", "mapfile", "readarray", "let"}
# words after which the next word is still a command word
PREFIXES = {"command", "builtin", "exec", "nohup", "time", "!", "then", "do", "else", "elif"}
PREFIXES |= {"if", "while", "until", "{", "(", "sudo", "env"}


# The appending line plan/grub.py writes: each listed word goes onto the end of the target
# variable unless the kernel line (the variables named, joined by spaces) has it already,
# so sourcing it twice adds nothing twice. POSIX sh (dash and bash read it alike).
LOOP_VAR = "_passthrough_arg"
APPEND_MISSING = re.compile(
    rf"for {LOOP_VAR} in ([^;]*); do "
    r'case " ((?:\$\{[A-Za-z_][A-Za-z0-9_]*\} ?)+) " in '
    rf'\*" \$\{{{LOOP_VAR}\}} "\*\) ;; '
    rf'\*\) ([A-Za-z_][A-Za-z0-9_]*)="\$\{{\3\}} \$\{{{LOOP_VAR}\}}" ;; '
    rf"esac; done; unset {LOOP_VAR}"
)


def append_missing(target: str, seen: Collection[str], words: list[str]) -> str:
    """The line that appends each of ``words`` to ``target`` unless ``seen`` has it."""
    listed = " ".join(shlex.quote(w) for w in words)
    scope = " ".join(f"${{{n}}}" for n in seen)
    return (
        f'for {LOOP_VAR} in {listed}; do case " {scope} " in *" ${{{LOOP_VAR}}} "*) ;; '
        f'*) {target}="${{{target}}} ${{{LOOP_VAR}}}" ;; esac; done; unset {LOOP_VAR}'
    )


def loop_words(line: str) -> tuple[str, tuple[str, ...]] | None:
    """Our appending line (``append_missing``) as (the variable it appends to, the words it
    lists), or None where ``line`` is not one."""
    m = APPEND_MISSING.fullmatch(line.strip())
    if m is None:
        return None
    try:
        return m[3], tuple(shlex.split(m[1]))
    except ValueError:
        return None


@dataclass(frozen=True)
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
    state.budget.spend(path, lines=len(lines), files=1)
    mention = re.compile(r"\b(" + "|".join(map(re.escape, sorted(state.names))) + r")\b")
    nesting = 0
    for first, last, code in lines:
        code = _strip(code)
        where = f"{path}:{first}"
        state.budget.spend(where)
        if not code:
            continue
        if _append_missing(code, state, where, Origin(path, first, last), nesting):
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
        if _sources_grub_d(code, state, where, read, depth, nesting):
            continue
        _unseen_setters(code, state, where, plain=m is not None)
        if m is None:
            nesting += sum(w in OPENERS for w in words) - sum(w in CLOSERS for w in words)
            nesting = max(nesting, 0)
        if m is None and words[0] == "export" and all("=" not in w for w in words[1:]):
            continue  # marking a variable for export changes no value
        if mention.search(code):
            raise UnsafeCmdline(where, "sets the command line in a way the planner does not parse")


def _strip(code: str) -> str:
    """The line without surrounding blanks, but a blank after a backslash is escaped (a
    literal blank, not a continuation) and stays."""
    head = code.lstrip(" \t")
    tail = head.rstrip(" \t")
    backslashes = len(tail) - len(tail.rstrip("\\"))
    return head[: len(tail) + 1] if len(tail) < len(head) and backslashes % 2 else tail


def _outside_substitutions(code: str) -> str:
    """``code`` with each command substitution (`…` and $(…)) replaced by a plain word: it
    runs in a subshell, so nothing in it sets a variable of this shell."""
    out: list[str] = []
    i, n = 0, len(code)
    quote = ""
    while i < n:
        c = code[i]
        if c == "\\":
            out.append(code[i : i + 2])
            i += 2
            continue
        if quote == "'" or (c == "'" and not quote):
            quote = "" if quote == "'" else "'"
        elif c == '"':
            quote = "" if quote == '"' else '"'
        elif c == "`" or code.startswith("$(", i):
            i = _substitution_end(code, i)
            out.append("_")
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _substitution_end(code: str, i: int) -> int:
    """The index after the substitution starting at ``i`` (the end of ``code`` when it is
    unterminated: the caller's shlex then refuses the rest)."""
    if code[i] == "`":
        j = i + 1
        while j < len(code) and code[j] != "`":
            j += 2 if code[j] == "\\" else 1
        return j + 1
    depth, j, quote = 0, i + 1, ""
    while j < len(code):
        c = code[j]
        if c == "\\" and quote != "'":
            j += 2
            continue
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return j


def _commands(code: str, where: str) -> list[list[str]]:
    """Each simple command's words, quotes removed (``A""B`` is ``AB``), from the first
    command word on: leading assignments, keywords and wrappers such as ``command`` are
    skipped."""
    lex = shlex.shlex(_outside_substitutions(code), posix=True, punctuation_chars=";&|()<>")
    lex.whitespace_split = True
    lex.commenters = ""
    try:
        tokens = list(lex)
    except ValueError:
        raise UnsafeCmdline(where, "has quoting the planner does not parse") from None
    out: list[list[str]] = [[]]
    for token in tokens:
        if token and all(c in ";&|()<>" for c in token):
            out.append([])
        elif out[-1] or not (token in PREFIXES or ASSIGN.match(token)):
            out[-1].append(token)
    return [c for c in out if c]


def _unseen_setters(code: str, state: ShellVars, where: str, plain: bool) -> None:
    """Refuse a line that could set a variable without spelling it as a plain name:
    eval/read/declare/… in any spelling, printf -v, or one of ours named once quotes are
    removed (``export GRUB_CMDLINE_LINUX""_DEFAULT=…``)."""
    for words in _commands(code, where):
        name = words[0]
        if name in SETTERS or (name == "printf" and any(w.startswith("-v") for w in words)):
            raise UnsafeCmdline(where, f"uses {name}, which can set the command line unseen")
        if name in (".", "source"):
            raise UnsafeCmdline(
                where, "sources a file where the planner cannot tell whether it runs"
            )
        # ours named in a spelling the raw line does not have: quotes or escapes in it
        hidden = [w for w in words if w.split("=", 1)[0] in state.names and w not in code]
        if not plain and hidden:
            raise UnsafeCmdline(
                where, "names the command line in a spelling the planner does not parse"
            )


# a loop that sources every grub.d/*.cfg (Garuda's /etc/default/grub has one), as
# Debian's grub-mkconfig does after it
GRUB_D_LOOP = re.compile(
    r'for (\w+) in "?(?:\$\{sysconfdir\}|\$sysconfdir|/etc)"?/default/grub\.d/\*\.cfg ?; ?do '
    r'(?:if \[ -e "\$\{?\1\}?" \]; then )?(?:source|\.) "\$\{?\1\}?";? (?:fi; )?done'
)


def _sources_grub_d(
    code: str, state: ShellVars, where: str, read: Reader | None, depth: int, nesting: int
) -> bool:
    """Source each /etc/default/grub.d/*.cfg in byte order for such a loop."""
    if GRUB_D_LOOP.fullmatch(re.sub(r"[ \t]+", " ", code)) is None:
        return False
    if state.listdir is None or nesting:
        raise UnsafeCmdline(where, "sources /etc/default/grub.d/*.cfg where the planner cannot")
    names = sorted(
        (n for n in state.listdir("/etc/default/grub.d") if n.endswith(".cfg")), key=str.encode
    )
    for name in names:
        _source_line([".", f"/etc/default/grub.d/{name}"], state, where, read, depth, 0)
    return True


def _append_missing(code: str, state: ShellVars, where: str, here: Origin, nesting: int) -> bool:
    """Evaluate our own appending line (``append_missing``); False when ``code`` is not one."""
    m = APPEND_MISSING.fullmatch(code)
    if m is None:
        return False
    seen = re.findall(r"\$\{(\w+)\}", m[2])
    if nesting or not {m[3], *seen} <= state.names:
        raise UnsafeCmdline(where, "has passthrough's appending line where it cannot be evaluated")
    try:
        listed = shlex.split(m[1])
    except ValueError:
        raise UnsafeCmdline(where, "has passthrough's appending line with broken quoting") from None
    for word in listed:
        scope = " " + " ".join(state.value(n) for n in seen) + " "
        if f" {word} " not in scope:
            state.values[m[3]] = [*state.values.get(m[3], []), *((c, here) for c in " " + word)]
    return True


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
