"""Hostile request values against the real API (and proxy) of a running stack: every one is a
4xx with a JSON body naming the field, and nothing is created — no sandbox record, no workload.

The user ``mallory`` exists only in this module, so "nothing created" is checked exactly: the
sandboxes bucket and the local runtime's workloads bucket hold nothing of hers afterwards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import nats
import pytest
from nats.js.errors import KeyNotFoundError

from shared.bus.kv import key_names
from shared.bus.topology import KV_SANDBOXES
from shared.runtime.local.instance import DEFAULT_BUCKET
from tests.support.keys import make_keys
from tests.support.stack import Stack

USER = "mallory"
E2B = ("/v2/sandboxes", "/sandboxes")
NATIVE = "/api/v1/sandbox"

HOSTILE_ENVS: list[tuple[dict[str, str], str]] = [
    ({"A": "x\0y"}, "NUL byte"),
    ({"A\0B": "x"}, "invalid"),
    ({"A=B": "x"}, "invalid"),
    ({"": "x"}, "empty"),
    ({"--ro-bind": "/ /"}, "invalid"),
    ({"-e": "x"}, "invalid"),
    ({"1ABC": "x"}, "invalid"),
    ({"A B": "x"}, "invalid"),
    ({"K" * 300: "x"}, "invalid"),
    ({"BIG": "x" * (33 * 1024)}, "longer than"),
    ({f"K{i}": "x" for i in range(129)}, "at most 128"),
    ({f"K{i}": "x" * 30_000 for i in range(10)}, "in total"),
]
HOSTILE_METADATA: list[dict[str, str]] = [
    {"k": "a\0b"},
    {"a\0b": "v"},
    {"": "v"},
    {"k": "line\nbreak"},
    {"k" * 300: "v"},
    {"k": "v" * 5000},
    {f"k{i}": "v" for i in range(65)},
]
HOSTILE_TEMPLATES = ["--ro-bind", "../etc/passwd", "a/b", "UPPER", "a\0b", "x" * 64, "-x", " "]


@pytest.fixture(scope="module")
def key(stack: Stack) -> str:
    return asyncio.run(make_keys(stack.nats_url, {USER: False}))[USER]


@pytest.fixture(scope="module")
def api(stack: Stack, key: str) -> Iterator[httpx.Client]:
    with httpx.Client(
        base_url=stack.api_url, headers={"X-API-KEY": key}, timeout=30, trust_env=False
    ) as c:
        yield c


def _refused(r: httpx.Response, field: str, status: int = 400) -> str:
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["code"] == status
    assert field in body["message"], body["message"]
    return str(body["message"])


async def _leftovers(nats_url: str) -> tuple[list[str], list[str]]:
    """Sandbox records and workloads owned by USER."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        found: tuple[list[str], list[str]] = ([], [])
        for bucket, out in ((KV_SANDBOXES, found[0]), (DEFAULT_BUCKET, found[1])):
            try:
                kv = await js.key_value(bucket)
            except Exception:
                continue
            for name in await key_names(kv):
                try:
                    entry = await kv.get(name)
                except KeyNotFoundError:
                    continue  # deleted
                if entry.value and f'"{USER}"' in entry.value.decode(errors="replace"):
                    out.append(name)
        return found
    finally:
        await nc.close()


@pytest.fixture(autouse=True)
def nothing_created(stack: Stack, key: str) -> Iterator[None]:
    yield
    records, workloads = asyncio.run(_leftovers(stack.nats_url))
    assert records == [], records
    assert workloads == [], workloads


@pytest.mark.parametrize(("envs", "why"), HOSTILE_ENVS)
def test_hostile_env_refused_on_both_apis(
    api: httpx.Client, envs: dict[str, str], why: str
) -> None:
    for path in E2B:
        message = _refused(api.post(path, json={"templateID": "base", "envVars": envs}), "envVars")
        assert why in message
    message = _refused(api.post(NATIVE, json={"envs": envs}), "envs", 422)
    assert why in message
    # Values may be secrets: an error never echoes one.
    for value in envs.values():
        if len(value) > 3:
            assert value not in message


@pytest.mark.parametrize("metadata", HOSTILE_METADATA)
def test_hostile_metadata_refused(api: httpx.Client, metadata: dict[str, str]) -> None:
    _refused(api.post("/v2/sandboxes", json={"metadata": metadata}), "metadata")
    _refused(api.post(NATIVE, json={"metadata": metadata}), "metadata", 422)


@pytest.mark.parametrize("template", HOSTILE_TEMPLATES)
def test_hostile_template_names_refused(api: httpx.Client, template: str) -> None:
    _refused(api.post("/v2/sandboxes", json={"templateID": template}), "templateID")
    _refused(api.post(NATIVE, json={"template": template}), "template", 422)


def test_unknown_template_is_400_before_any_record(api: httpx.Client) -> None:
    _refused(api.post("/v2/sandboxes", json={"templateID": "no-such-template"}), "templateID")
    _refused(api.post(NATIVE, json={"template": "no-such-template"}), "template")
    listed = api.get(NATIVE).json()["sandboxes"]
    assert listed == []


def test_non_string_and_malformed_bodies(api: httpx.Client) -> None:
    _refused(api.post("/v2/sandboxes", json={"envVars": {"A": 1}}), "envVars")
    _refused(api.post("/v2/sandboxes", json={"envVars": ["A=b"]}), "envVars")
    _refused(api.post("/v2/sandboxes", json={"metadata": "x"}), "metadata")
    _refused(api.post("/v2/sandboxes", json={"timeout": -1}), "timeout")
    r = api.post(
        "/v2/sandboxes", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    assert r.json()["code"] == 400


UNENFORCED: list[tuple[str, dict[str, Any], str]] = [
    ("/v2/sandboxes", {"mcp": {"github": {"token": "x"}}}, "mcp"),
    ("/v2/sandboxes", {"iam": {"tokens": {"aws": {"audience": "a"}}}}, "iam"),
    ("/v2/sandboxes", {"volumeMounts": [{"name": "v", "path": "/data"}]}, "volumeMounts"),
    ("/v2/sandboxes", {"autoPauseMemory": "true"}, "autoPauseMemory"),
    ("/v2/sandboxes", {"autoPauseMemory": 1}, "autoPauseMemory"),
    ("/v2/sandboxes", {"network": {"rules": {"api.example.com": []}}}, "network.rules"),
    ("/v2/sandboxes", {"network": {"egressProxy": {"address": "p:1080"}}}, "network.egressProxy"),
    ("/v2/sandboxes", {"network": {"dnsServers": ["10.0.0.53"]}}, "network.dnsServers"),
    ("/v2/sandboxes", {"network": {"maskRequestHost": "h"}}, "network.maskRequestHost"),
    ("/v2/sandboxes", {"network": {"httpsPorts": [8443]}}, "network.httpsPorts"),
    ("/v2/sandboxes", {"network": {"allowOut": ["example.com"]}}, "network.allowOut"),
    ("/v2/sandboxes", {"network": {"denyOut": ["*.example.com"]}}, "network.denyOut"),
    ("/v2/sandboxes", {"network": {"allowOut": ["10.0.0.0/33"]}}, "network.allowOut"),
    ("/v2/sandboxes", {"network": {"allowOut": ["10.0.0.1\u0000"]}}, "network.allowOut"),
    ("/v2/sandboxes", {"network": {"denyOut": ["0.0.0.0/0"] * 300}}, "network.denyOut"),
    ("/v2/sandboxes", {"network": {"bogus": 1}}, "network.bogus"),
    ("/v2/sandboxes", {"noSuchField": 1}, "noSuchField"),
    ("/v2/sandboxes", {"autoResume": {"enabled": True, "x": 1}}, "autoResume"),
    (NATIVE, {"noSuchField": 1}, "noSuchField"),
]


@pytest.mark.parametrize(("path", "body", "field"), UNENFORCED)
def test_unenforced_fields_are_refused(
    api: httpx.Client, path: str, body: dict[str, Any], field: str
) -> None:
    message = _refused(api.post(path, json=body), field, 422 if path == NATIVE else 400)
    assert "p:1080" not in message  # values are not echoed back


def test_unenforced_fields_on_other_calls(stack: Stack, api: httpx.Client) -> None:
    # Unknown sandbox: the body is judged first, so these are 400s naming the field, not 404s.
    sid = "inosuchsandbox0000000"
    _refused(api.post(f"/v2/sandboxes/{sid}/connect", json={"memory": "false"}), "memory")
    _refused(api.post(f"/sandboxes/{sid}/resume", json={"memory": 0}), "memory")
    _refused(api.post(f"/sandboxes/{sid}/resume", json={"autoPause": "no"}), "autoPause")
    _refused(api.post(f"/sandboxes/{sid}/timeout", json={"timeout": 5, "x": 1}), "x")
    _refused(api.put(f"/sandboxes/{sid}/network", json={"allowOut": ["a.example"]}), "allowOut")
    _refused(api.put(f"/sandboxes/{sid}/network", json={"rules": {"a": []}}), "rules")
    _refused(
        api.put(f"/sandboxes/{sid}/network", json={"allowPublicTraffic": False}),
        "allowPublicTraffic",
    )
    # What the unmodified SDKs send stays accepted: the Python SDK's filesystem pause, the JS
    # SDK's default pause (memory: true, always), a reboot connect.
    assert api.post(f"/sandboxes/{sid}/pause", json={"memory": False}).status_code == 404
    assert api.post(f"/sandboxes/{sid}/pause", json={"memory": True}).status_code == 404
    r = api.post(f"/v2/sandboxes/{sid}/connect", json={"timeout": 5, "memory": False})
    assert r.status_code == 404
    assert api.post(f"/sandboxes/{sid}/resume", json={"memory": True}).status_code == 404


BAD_PORTS = [
    b"abc",
    b"-1",
    b"0",
    b"65536",
    b"99999999999999999999",
    b"\xb2",  # latin-1 superscript two: str.isdigit() says yes, int() says no
    "\u0663".encode(),  # Arabic-Indic digit three
    b"1 2",
    b"0x50",
    b"+80",
]


@pytest.mark.parametrize("port", BAD_PORTS)
def test_malformed_sandbox_port_header_is_400_at_the_proxy(stack: Stack, port: bytes) -> None:
    r = httpx.get(
        f"{stack.proxy_url}/",
        headers=[(b"E2b-Sandbox-Id", b"inosuchsandbox0000000"), (b"E2b-Sandbox-Port", port)],
        timeout=10,
        trust_env=False,
    )
    assert r.status_code == 400, (port, r.status_code, r.text)
    assert r.json()["code"] == 400
    assert "E2b-Sandbox-Port" in r.json()["message"]
