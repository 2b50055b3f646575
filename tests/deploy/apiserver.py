"""A tiny server-side-apply client for the real kube-apiserver: returns the ``Warning`` headers
(deprecations, pod-security findings) that the official Python client drops."""

from __future__ import annotations

import base64
import json
import socket
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

FIELD_MANAGER = "torpor-deploy-test"


def is_local(host: str) -> bool:
    """Loopback, or an address of this machine (the real node's bridge, made by the rig): only
    a local address can be bound."""
    if host == "localhost":
        return True
    try:
        with socket.socket() as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


@dataclass
class Applied:
    status: int
    warnings: list[str]
    body: dict[str, Any]


@dataclass
class Apiserver:
    kubeconfig: Path
    workdir: Path
    _client: httpx.Client = field(init=False)
    ca_file: str = field(init=False)  # the cluster's CA (for clients with other credentials)
    _resources: dict[tuple[str, str], tuple[str, bool]] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        config = yaml.safe_load(self.kubeconfig.read_text())
        ctx_name = config["current-context"]
        ctx = next(c["context"] for c in config["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == ctx["user"])
        self.workdir.mkdir(parents=True, exist_ok=True)

        def materialise(data_key: str, file_key: str, name: str, section: dict[str, Any]) -> str:
            if file_key in section:
                return str(section[file_key])
            path = self.workdir / name
            path.write_bytes(base64.b64decode(section[data_key]))
            path.chmod(0o600)
            return str(path)

        self.ca_file = materialise(
            "certificate-authority-data", "certificate-authority", "ca.crt", cluster
        )
        tls = ssl.create_default_context(cafile=self.ca_file)
        headers = {}
        if "token" in user:
            headers["Authorization"] = f"Bearer {user['token']}"
        else:
            tls.load_cert_chain(
                materialise("client-certificate-data", "client-certificate", "client.crt", user),
                materialise("client-key-data", "client-key", "client.key", user),
            )
        server = str(cluster["server"])
        assert is_local(httpx.URL(server).host), f"this machine's addresses only: {server}"
        self._client = httpx.Client(base_url=server, verify=tls, headers=headers, timeout=30)

    @property
    def client(self) -> httpx.Client:
        """The authenticated client, for plain reads and the odd POST (TokenRequest)."""
        return self._client

    def close(self) -> None:
        self._client.close()

    def _resource(self, api_version: str, kind: str) -> tuple[str, bool]:
        key = (api_version, kind)
        if key not in self._resources:
            path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            reply = self._client.get(path)
            reply.raise_for_status()
            for r in reply.json()["resources"]:
                if "/" not in r["name"]:
                    self._resources[(api_version, r["kind"])] = (r["name"], bool(r["namespaced"]))
        if key not in self._resources:
            msg = f"the apiserver does not serve {kind} in {api_version}"
            raise LookupError(msg)
        return self._resources[key]

    def url(self, obj: dict[str, Any]) -> str:
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural, namespaced = self._resource(api_version, kind)
        prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        name = obj["metadata"]["name"]
        if namespaced:
            ns = obj["metadata"].get("namespace", "default")
            return f"{prefix}/namespaces/{ns}/{plural}/{name}"
        return f"{prefix}/{plural}/{name}"

    def apply(self, obj: dict[str, Any], *, dry_run: bool) -> Applied:
        params = {"fieldManager": FIELD_MANAGER, "force": "true"}
        if dry_run:
            params["dryRun"] = "All"
        reply = self._client.patch(
            self.url(obj),
            params=params,
            content=json.dumps(obj).encode(),
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        try:
            body = reply.json()
        except ValueError:
            body = {"raw": reply.text}
        return Applied(
            status=reply.status_code, warnings=reply.headers.get_list("warning"), body=body
        )
