"""Per-repository settings for ``validate``: ``[tool.passthrough.validate]`` in the nearest
``pyproject.toml`` (from the current directory up), or a file given with ``--config``
(TOML with that table, or YAML with the same keys at the top). Command-line flags win:
``--select`` replaces the configured list, ``--ignore`` adds to it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from passthrough.errors import PassthroughError

KEYS = {"select", "ignore", "strict", "schema-only", "schema-dir"}


@dataclass(frozen=True)
class Config:
    select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    strict: bool = False
    schema_only: bool = False
    schema_dir: str | None = None
    source: str | None = None  # the file it came from


class BadConfig(PassthroughError):
    pass


def _table(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadConfig(f"{path}: {exc.strerror}") from None
    if path.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(raw) or {}
        except yaml.YAMLError as exc:
            raise BadConfig(f"{path}: not valid YAML ({exc})") from None
        if not isinstance(data, dict):
            raise BadConfig(f"{path}: expected a mapping of validate settings")
        return data
    import tomllib

    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise BadConfig(f"{path}: not valid TOML ({exc})") from None
    table = doc.get("tool", {}).get("passthrough", {}).get("validate")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise BadConfig(f"{path}: [tool.passthrough.validate] must be a table")
    return table


def find(start: Path) -> Path | None:
    for d in (start, *start.parents):
        p = d / "pyproject.toml"
        if p.is_file():
            return p
    return None


def load(explicit: str | None, start: Path | None = None) -> Config:
    path = Path(explicit) if explicit else find(start or Path.cwd())
    if path is None:
        return Config()
    table = _table(path)
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
        schema_dir = str((path.parent / schema_dir).resolve())  # relative to the config file
    return Config(
        strings("select"),
        strings("ignore"),
        flag("strict"),
        flag("schema-only"),
        schema_dir,
        str(path),
    )
