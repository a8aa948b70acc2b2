# SPDX-License-Identifier: Apache-2.0
"""A STAND-IN Kubernetes API (no real cluster can run here): a small HTTP server on 127.0.0.1
answering the few calls kubernetes.core's k8s_info and k8s_drain make through the real
kubernetes Python client, with a node and its pods in memory and every call recorded.

Discovery (/version, /api, /apis, /api/v1), the node (read, patch its spec.unschedulable), the
pods on it (list by spec.nodeName, read, evict). Anything else is a 404, which the test then
sees as the module's failure. Bounded: it serves until the test's fixture shuts it down.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

RESOURCES = [
    {"name": "nodes", "namespaced": False, "kind": "Node", "verbs": ["get", "list", "patch"]},
    {"name": "pods", "namespaced": True, "kind": "Pod", "verbs": ["get", "list", "delete"]},
    {"name": "pods/eviction", "namespaced": True, "kind": "Eviction", "verbs": ["create"]},
]


class Cluster:
    """One node and its pods; ``calls``: (method, path) in the order they came."""

    def __init__(self, node: str, pods: list[dict[str, Any]]) -> None:
        self.node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node},
            "spec": {},
        }
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def answer(self, method: str, path: str, query: dict[str, list[str]], body: Any) -> Any:
        """(status, document) for one call."""
        name = self.node["metadata"]["name"]
        parts = path.strip("/").split("/")
        if path == "/version":
            return 200, {"major": "1", "minor": "35", "gitVersion": "v1.35.0"}
        if path == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"]}
        if path == "/apis":
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
        if path == "/api/v1":
            doc = {"kind": "APIResourceList", "groupVersion": "v1", "resources": RESOURCES}
            return 200, doc
        if path == f"/api/v1/nodes/{name}":
            if method == "PATCH":
                self.node["spec"]["unschedulable"] = bool(body["spec"]["unschedulable"])
            return 200, self.node
        if path == "/api/v1/pods":
            selector = (query.get("fieldSelector") or [""])[0]
            items = [
                p
                for p in self.pods.values()
                if selector == f"spec.nodeName={p['spec']['nodeName']}"
            ]
            return 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items}
        if len(parts) >= 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
            key = (parts[3], parts[5])
            if key not in self.pods:
                return 404, {
                    "kind": "Status",
                    "status": "Failure",
                    "reason": "NotFound",
                    "code": 404,
                }
            if parts[6:] == ["eviction"] and method == "POST":
                del self.pods[key]
                return 201, {"kind": "Status", "status": "Success"}
            return 200, self.pods[key]
        return 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}


def _handler(cluster: Cluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null") if length else None
            with cluster.lock:
                cluster.calls.append((self.command, url.path))
                status, doc = cluster.answer(self.command, url.path, parse_qs(url.query), body)
            data = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class StandIn:
    """The server on 127.0.0.1 (a free port) in a thread, and a kubeconfig that points at it."""

    def __init__(self, cluster: Cluster, folder: Path) -> None:
        self.cluster = cluster
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(cluster))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.kubeconfig = folder / "kubeconfig"
        self.kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "standin", "cluster": {"server": url}}],
                    "users": [{"name": "standin", "user": {}}],
                    "contexts": [
                        {"name": "standin", "context": {"cluster": "standin", "user": "standin"}}
                    ],
                    "current-context": "standin",
                }
            )
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def pod(name: str, node: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    """A running pod on ``node`` whose one container has ``limits``."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "default",
            # a ReplicaSet's: drain evicts it (an unmanaged pod would need force)
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name, "uid": name}
            ],
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "x", "resources": {"limits": limits or {}}}],
        },
        "status": {"phase": "Running"},
    }
