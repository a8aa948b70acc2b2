# SPDX-License-Identifier: Apache-2.0
"""Offline schema checks for cluster manifests, from files other people wrote.

KubeVirt kinds against KubeVirt's own OpenAPI (swagger 2.0) in ../shared/realworld/kubernetes/,
made strict (an unknown field is an error, as the API server's strict field validation makes
it); Kubernetes' own kinds with kubernetes-validate at pinned versions; the DRA driver's opaque
parameters against the hand-written schema of its v1beta1 types. Nothing is copied in: the
files are read where they lie (override with PASSTHROUGH_REALWORLD).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate

REALWORLD = Path(
    os.environ.get(
        "PASSTHROUGH_REALWORLD", str(Path(__file__).parents[1].parent / "shared" / "realworld")
    )
)
KUBERNETES = REALWORLD / "kubernetes"
# resource.k8s.io/v1 is served from 1.34 on; kubernetes-validate ships 1.34..1.37
K8S_VERSIONS = ("1.34.0", "1.35.0", "1.36.0", "1.37.0")
KUBEVIRT_KINDS = {"KubeVirt": "v1.KubeVirt", "VirtualMachine": "v1.VirtualMachine"}


def _strict(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.cache
def _swagger_definitions() -> dict[str, Any]:
    data = json.loads((KUBERNETES / "kubevirt-swagger.json").read_text())
    return _strict(copy.deepcopy(data["definitions"]))  # type: ignore[no-any-return]


def kubevirt_errors(doc: dict[str, Any]) -> list[str]:
    schema = {
        "definitions": _swagger_definitions(),
        "$ref": f"#/definitions/{KUBEVIRT_KINDS[doc['kind']]}",
    }
    validator = jsonschema.Draft4Validator(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


@functools.cache
def _opaque_schema() -> dict[str, Any]:
    return json.loads((KUBERNETES / "dra-nvidia-opaque-config.schema.json").read_text())  # type: ignore[no-any-return]


def opaque_errors(parameters: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(_opaque_schema())
    return [e.message for e in validator.iter_errors(parameters)]


def kubernetes_errors(doc: dict[str, Any]) -> list[str]:
    errors = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{version}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{version}: no schema ({exc})")
    return errors


def manifest_errors(doc: dict[str, Any]) -> list[str]:
    """Every error of one object, whichever schema it belongs to."""
    if doc["kind"] in KUBEVIRT_KINDS:
        return kubevirt_errors(doc)
    errors = kubernetes_errors(doc)
    if doc["kind"] == "ResourceClaimTemplate":
        for config in doc["spec"]["spec"]["devices"].get("config", []):
            errors += opaque_errors(config["opaque"]["parameters"])
    return errors
