"""Reading a sandbox's data claim as the admin: a deleted claim can linger while its pod
terminates (the pvc-protection finalizer), so "gone" is waited for, never read once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes.aio import client as k8s
from kubernetes.aio.client.exceptions import ApiException


async def read_claim(api: k8s.ApiClient, ns: str, name: str) -> Any | None:
    try:
        return await k8s.CoreV1Api(api).read_namespaced_persistent_volume_claim(name, ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


async def wait_claim_gone(api: k8s.ApiClient, ns: str, name: str, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while await read_claim(api, ns, name) is not None:
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"claim {ns}/{name} still exists after {timeout:g}s")
        await asyncio.sleep(0.1)
