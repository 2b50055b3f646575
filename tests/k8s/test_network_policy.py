"""The per-sandbox Kubernetes NetworkPolicy: the translation of torpor's network rule into
egress rules (checked against ``NetworkPolicy.permits`` address by address), and the objects on
a real kube-apiserver: applied before the first pod, replaced live by ``set_network``, kept
across scale 0/1, deleted with the sandbox.

The rig has no CNI, so nothing here shows packets being dropped: which CNIs enforce the objects
is in docs/security.md; egress from inside a sandbox is tested on the local runtime."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException

from shared.errors import NotFound
from shared.models.network import NetworkPolicy
from shared.ports.workloads import LABEL_SANDBOX_ID, WorkloadSpec
from shared.runtime.kubernetes import KubernetesRuntime
from shared.runtime.kubernetes.objects import LABEL_SANDBOX_ACCESS, egress_rules

POLICIES = [
    NetworkPolicy(),
    NetworkPolicy(allow_internet=False),
    NetworkPolicy(allow_internet=False, allow_out=("10.1.2.3", "2001:db8::/64")),
    NetworkPolicy(deny_out=("10.0.0.0/8", "192.168.1.0/24")),
    NetworkPolicy(deny_out=("0.0.0.0/0",), allow_out=("8.8.8.8",)),
    NetworkPolicy(deny_out=("::/0",)),
    NetworkPolicy(deny_out=("10.0.0.0/8",), allow_out=("10.9.0.0/16",)),
    NetworkPolicy(allow_out=("10.0.0.1",)),  # allow alone changes nothing (E2B)
]
ADDRESSES = [
    "10.1.2.3",
    "10.1.2.4",
    "10.9.9.9",
    "10.200.0.1",
    "8.8.8.8",
    "192.168.1.7",
    "192.168.2.7",
    "203.0.113.5",
    "2001:db8::1",
    "2001:db9::1",
    "::1",
]


def allowed_by(rules: list[dict[str, Any]], address: str) -> bool:
    """How a CNI evaluates egress rules: allowed if any rule admits the destination."""
    ip = ipaddress.ip_address(address)
    for rule in rules:
        peers = rule.get("to")
        if not peers:
            return True
        for peer in peers:
            block = peer["ipBlock"]
            net = ipaddress.ip_network(block["cidr"])
            if ip.version != net.version or ip not in net:
                continue
            if not any(ip in ipaddress.ip_network(e) for e in block.get("except", [])):
                return True
    return False


@pytest.mark.parametrize("policy", POLICIES)
def test_egress_rules_implement_permits_exactly(policy: NetworkPolicy) -> None:
    rules = egress_rules(policy)
    for address in ADDRESSES:
        assert allowed_by(rules, address) == policy.permits(address), (policy, address, rules)
    for rule in rules:  # what the API server validates: except strictly inside its cidr
        for peer in rule.get("to", []):
            net = ipaddress.ip_network(peer["ipBlock"]["cidr"])
            for e in peer["ipBlock"].get("except", []):
                sub = ipaddress.ip_network(e)
                assert sub.subnet_of(net)  # type: ignore[arg-type]
                assert sub.prefixlen > net.prefixlen


async def _policy(api: k8s.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    try:
        obj = await k8s.NetworkingV1Api(api).read_namespaced_network_policy(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    out: dict[str, Any] = api.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return out


@pytest.mark.k8s
@pytest.mark.timeout(180)
async def test_network_policy_objects_follow_the_sandbox(
    k8s_runtime: KubernetesRuntime, admin_api: k8s.ApiClient
) -> None:
    rt, name, ns = k8s_runtime, "sbx-netpol", k8s_runtime.namespace
    closed = NetworkPolicy(allow_internet=False, allow_out=("10.1.2.3",))
    await rt.create(WorkloadSpec(name=name, owner="alice", network=closed, replicas=0))
    obj = await _policy(admin_api, ns, name)
    assert obj is not None
    spec = obj["spec"]
    assert spec["podSelector"] == {"matchLabels": {LABEL_SANDBOX_ID: name}}
    assert sorted(spec["policyTypes"]) == ["Egress", "Ingress"]
    assert spec["egress"] == [{"to": [{"ipBlock": {"cidr": "10.1.2.3/32"}}]}]
    assert spec["ingress"] == [
        {"from": [{"podSelector": {"matchLabels": {LABEL_SANDBOX_ACCESS: "true"}}}]}
    ]
    managers = {m["manager"] for m in obj["metadata"]["managedFields"]}
    assert "torpor" in managers  # server-side applied under torpor's field manager

    await rt.scale(name, 1)
    await rt.wait_ready(name, timeout=60)
    opened = NetworkPolicy(deny_out=("10.0.0.0/8",))
    await rt.set_network(name, opened)
    spec = (await _policy(admin_api, ns, name) or {})["spec"]
    assert spec["egress"] == [
        {
            "to": [
                {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8"]}},
                {"ipBlock": {"cidr": "::/0"}},
            ]
        }
    ]
    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=60)
    assert (await _policy(admin_api, ns, name) or {})["spec"]["egress"] == spec["egress"]

    await rt.delete(name)
    assert await _policy(admin_api, ns, name) is None
    with pytest.raises(NotFound):
        await rt.set_network(name, opened)  # no workload: NotFound, and no stray policy
    assert await _policy(admin_api, ns, name) is None


@pytest.mark.k8s
@pytest.mark.timeout(120)
async def test_control_plane_namespace_selects_its_pods(
    k8s_runtime: KubernetesRuntime, admin_api: k8s.ApiClient
) -> None:
    ns = k8s_runtime.namespace
    rt = KubernetesRuntime(
        admin_api, namespace=ns, control_plane_namespace="torpor", templates=None
    )
    await rt.create(WorkloadSpec(name="sbx-netpol-ns", owner="bob", replicas=0))
    try:
        obj = await _policy(admin_api, ns, "sbx-netpol-ns")
        assert obj is not None
        peer = obj["spec"]["ingress"][0]["from"][0]
        assert peer["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "torpor"}
        }
        assert obj["spec"]["egress"] == [{}]  # open: every destination
    finally:
        await rt.delete("sbx-netpol-ns")
