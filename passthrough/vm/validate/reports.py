# SPDX-License-Identifier: Apache-2.0
"""Reports CI systems read: JUnit XML (one test case per file) and SARIF 2.1.0 (findings as
code-scanning annotations on their line). Both built as data, never by string concatenation."""

from __future__ import annotations

import os

from passthrough import __version__

from .rules import RULES, DomainFinding, Selection

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

Results = dict[str, list[DomainFinding]]

SARIF_SCHEMA = (
    "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
)
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def junit(results: Results, selection: Selection, schemas: str) -> bytes:
    import xml.etree.ElementTree as ET

    failing = sum(1 for fs in results.values() if any(selection.fails(f) for f in fs))
    suite = ET.Element(
        "testsuite",
        name="passthrough validate",
        tests=str(len(results)),
        failures=str(failing),
        errors="0",
    )
    props = ET.SubElement(suite, "properties")
    ET.SubElement(props, "property", name="schemas", value=schemas)
    for name, findings in results.items():
        case = ET.SubElement(suite, "testcase", classname="passthrough.validate", name=name)
        failed = [f for f in findings if selection.fails(f)]
        if failed:
            fail = ET.SubElement(case, "failure", message=failed[0].message, type=failed[0].code)
            fail.text = "\n".join(f.text() for f in failed)
        rest = [f for f in findings if not selection.fails(f)]
        if rest:
            ET.SubElement(case, "system-out").text = "\n".join(f.text() for f in rest)
    body: bytes = ET.tostring(suite, encoding="utf-8", xml_declaration=True)
    return body + b"\n"


def _uri(path: str) -> str:
    from urllib.parse import quote

    # relative to the checkout (where CI runs) so annotations land on the repository's file
    rel = os.path.relpath(path)
    if rel.startswith(".."):
        return "file://" + quote(os.path.abspath(path))
    return quote(rel.replace(os.sep, "/"))


def sarif(results: Results, schemas: str) -> str:
    import json

    used = sorted({f.code for fs in results.values() for f in fs})
    codes = [r.code for r in RULES.values()] + [c for c in used if c not in RULES]
    index = {c: i for i, c in enumerate(codes)}
    rules: list[dict[str, Any]] = []
    for code in codes:
        rule = RULES.get(code)
        rules.append(
            {
                "id": code,
                "name": code,
                "shortDescription": {"text": rule.rationale if rule else code},
                "defaultConfiguration": {"level": _SARIF_LEVEL[rule.severity] if rule else "error"},
                "properties": {"layer": rule.layer if rule else "host"},
            }
        )
    out: list[dict[str, Any]] = []
    for name, findings in results.items():
        for f in findings:
            physical: dict[str, Any] = {"artifactLocation": {"uri": _uri(name)}}
            if f.line > 0:
                physical["region"] = {"startLine": f.line}
            out.append(
                {
                    "ruleId": f.code,
                    "ruleIndex": index[f.code],
                    "level": _SARIF_LEVEL[str(f.severity)],
                    "message": {"text": f.message},
                    "locations": [
                        {
                            "physicalLocation": physical,
                            "logicalLocations": [
                                {"fullyQualifiedName": f.xpath, "kind": "element"}
                            ],
                        }
                    ],
                    "properties": {"layer": f.layer},
                }
            )
    log = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "passthrough validate",
                        "version": __version__,
                        "rules": rules,
                    }
                },
                "properties": {"schemas": schemas},
                "results": out,
            }
        ],
    }
    return json.dumps(log, indent=2) + "\n"


def as_json(results: Results, selection: Selection, schemas: str) -> dict[str, Any]:
    return {
        "schema": "passthrough.validate/v1",
        "schemas": schemas,
        "ok": not any(selection.fails(f) for fs in results.values() for f in fs),
        "files": [
            {
                "file": name,
                "ok": not any(selection.fails(f) for f in fs),
                "findings": [f.as_json() for f in fs],
            }
            for name, fs in results.items()
        ],
    }


def text(results: Results, selection: Selection, schemas: str) -> str:
    lines = [f.text() for fs in results.values() for f in fs]
    failing = sum(1 for fs in results.values() if any(selection.fails(f) for f in fs))
    lines.append(f"{len(results) - failing} valid, {failing} failing (against {schemas})")
    return "\n".join(lines) + "\n"


def catalogue(as_json_list: bool = False) -> str:
    import json

    if as_json_list:
        return (
            json.dumps(
                [
                    {
                        "code": r.code,
                        "layer": r.layer,
                        "severity": r.severity,
                        "rationale": r.rationale,
                    }
                    for r in RULES.values()
                ],
                indent=2,
            )
            + "\n"
        )
    width = max(len(c) for c in RULES)
    return "".join(
        f"{r.code:<{width}}  {r.layer:<7}  {r.severity:<7}  {r.rationale}\n" for r in RULES.values()
    )
