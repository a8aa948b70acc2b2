# SPDX-License-Identifier: Apache-2.0
"""Per-repository settings for ``validate``: ``[tool.passthrough.validate]`` in the nearest
``pyproject.toml`` (from the current directory up), or a file given with ``--config``
(TOML with that table, or YAML with the same keys at the top). Command-line flags win:
``--select`` replaces the configured list, ``--ignore`` adds to it."""

from __future__ import annotations

import os

from passthrough.errors import PassthroughError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

KEYS = {"select", "ignore", "strict", "schema-only", "schema-dir"}


class Config:
    __slots__ = ("ignore", "schema_dir", "schema_only", "select", "source", "strict")

    def __init__(
        self,
        select: tuple[str, ...] = (),
        ignore: tuple[str, ...] = (),
        strict: bool = False,
        schema_only: bool = False,
        schema_dir: str | None = None,
        source: str | None = None,
    ) -> None:
        self.select = select
        self.ignore = ignore
        self.strict = strict
        self.schema_only = schema_only
        self.schema_dir = schema_dir
        self.source = source  # the file it came from


class BadConfig(PassthroughError):
    pass


def _table(path: str, explicit: bool) -> dict[str, Any] | None:
    from passthrough.inputs import Unreadable, read_bytes

    try:  # bounded, non-blocking, regular files only
        raw = read_bytes(path, "a validate config")
    except Unreadable as exc:
        raise BadConfig(f"{path}: {exc}") from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        from passthrough.inputs import yaml_without_aliases

        try:
            data = yaml.load(raw, Loader=yaml_without_aliases("a validate config")) or {}
        except Unreadable as exc:
            raise BadConfig(f"{path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise BadConfig(f"{path}: not valid YAML ({exc})") from None
        if not isinstance(data, dict):
            raise BadConfig(f"{path}: expected a mapping of validate settings")
        return data
    if not explicit and b"[tool.passthrough" not in raw:
        return None  # most pyproject.toml files: no need to parse them
    import tomllib

    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadConfig(f"{path}: not valid TOML ({exc})") from None
    except ValueError:  # tomllib's int() of more digits than Python converts
        raise BadConfig(f"{path}: an integer of thousands of digits: not valid TOML") from None
    table = doc.get("tool", {}).get("passthrough", {}).get("validate")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise BadConfig(f"{path}: [tool.passthrough.validate] must be a table")
    return table


def find(start: str) -> str | None:
    d = os.path.abspath(start)
    while True:
        p = os.path.join(d, "pyproject.toml")
        if os.path.isfile(p):
            return p
        parent = os.path.dirname(d)
        if parent == d:
            return None
        d = parent


def load(explicit: str | None, start: str | None = None) -> Config:
    path = explicit or find(start or os.getcwd())
    if path is None:
        return Config()
    table = _table(path, bool(explicit))
    if table is None:
        if explicit:
            raise BadConfig(f"{path}: no [tool.passthrough.validate] table")
        return Config()
    unknown = sorted(set(table) - KEYS)
    if unknown:
        raise BadConfig(f"{path}: unknown validate setting(s) {', '.join(unknown)}")

    def strings(key: str) -> tuple[str, ...]:
        v = table.get(key, [])
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise BadConfig(f"{path}: {key} must be a list of rule codes or prefixes")
        return tuple(v)

    def flag(key: str) -> bool:
        v = table.get(key, False)
        if not isinstance(v, bool):
            raise BadConfig(f"{path}: {key} must be true or false")
        return v

    schema_dir = table.get("schema-dir")
    if schema_dir is not None:
        if not isinstance(schema_dir, str):
            raise BadConfig(f"{path}: schema-dir must be a path")
        # relative to the config file, as a repository means it
        schema_dir = os.path.normpath(
            os.path.join(os.path.dirname(os.path.abspath(path)), schema_dir)
        )
    return Config(
        strings("select"),
        strings("ignore"),
        flag("strict"),
        flag("schema-only"),
        schema_dir,
        path,
    )
