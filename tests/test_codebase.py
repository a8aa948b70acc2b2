"""The size rule of issue 11: no module in passthrough/ (or the collection's plugins) over 400
lines, no function over 80 lines, except data tables named here with the reason.

Big modules and long functions are where a reader loses the thread; the rule is kept by a test
rather than by review so it cannot drift back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
COLLECTION_PLUGINS = REPO / "playbooks/ansible_collections/passthrough/gpu/plugins"

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

# module (relative to the repository) -> why it may be longer: data, not logic
MODULE_ALLOW: dict[str, str] = {
    "passthrough/vm/options.py": (
        "OPTIONS, the one table of VM options (issue 11 item 4), is 133 of its lines; the code "
        "around it (checks, CLI flags, Ansible argument_spec) is under 300"
    ),
}

# "module:qualified.function" -> why it may be longer
FUNCTION_ALLOW: dict[str, str] = {}


def _modules() -> list[Path]:
    """Every Python file under passthrough/ and the collection's plugins, links resolved and
    each counted once (passthrough/guest links into the collection)."""
    seen: dict[Path, Path] = {}
    for top in (REPO / "passthrough", COLLECTION_PLUGINS):
        for path in sorted(top.rglob("*.py")):
            seen.setdefault(path.resolve(), path)
    return sorted(seen.values())


def _name(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _functions(tree: ast.AST) -> list[tuple[str, int]]:
    """(qualified name, lines from `def` to the last line of the body) of every function."""
    found: list[tuple[str, int]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                found.append((name, end - child.lineno + 1))
                walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(tree, "")
    return found


MODULES = _modules()


def test_the_rule_sees_the_package_and_the_collection() -> None:
    names = {_name(p) for p in MODULES}
    assert "passthrough/model.py" in names
    assert any(n.startswith("playbooks/ansible_collections/") for n in names)
    # the guest code is counted once, under passthrough/ where the links are
    assert not any("module_utils/passthrough_guest/" in n for n in names)


def test_the_measure_counts_what_it_should() -> None:
    source = "def f():\n    x = 1\n\n    return x\n\n\nclass C:\n    def g(self):\n        pass\n"
    assert _functions(ast.parse(source)) == [("f", 4), ("C.g", 2)]


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_module_size(path: Path) -> None:
    name = _name(path)
    lines = len(path.read_text(encoding="utf-8").splitlines())
    if name in MODULE_ALLOW:
        assert lines > MAX_MODULE_LINES, (
            f"{name} is back under the limit: drop it from MODULE_ALLOW"
        )
        return
    assert lines <= MAX_MODULE_LINES, f"{name}: {lines} lines (limit {MAX_MODULE_LINES})"


@pytest.mark.parametrize("path", MODULES, ids=_name)
def test_function_size(path: Path) -> None:
    name = _name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    long = {f"{name}:{fn}": n for fn, n in _functions(tree) if n > MAX_FUNCTION_LINES}
    allowed = {k for k in FUNCTION_ALLOW if k.startswith(f"{name}:")}
    assert allowed <= set(long), f"allowed but now short, drop: {sorted(allowed - set(long))}"
    over = {k: n for k, n in long.items() if k not in FUNCTION_ALLOW}
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"


# -- one version, one licence ------------------------------------------------------------


def test_the_version_is_set_in_one_place() -> None:
    """passthrough/__init__.py holds it; the wheel takes it from there (pyproject's dynamic
    version) and the collection's galaxy.yml, which Ansible reads as plain YAML, must agree."""
    import tomllib

    import yaml

    from passthrough import __version__

    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "passthrough.__version__"
    }
    galaxy = yaml.safe_load(
        (REPO / "playbooks/ansible_collections/passthrough/gpu/galaxy.yml").read_text()
    )
    assert galaxy["version"] == __version__


def test_the_licence_the_metadata_names_is_shipped() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
