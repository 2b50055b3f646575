"""The control plane rig itself: certificates, the built version, and a clean shutdown."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from kubernetes.aio import client as k8s

from tests.support.k8s.rig import ClusterAccess, ControlPlane, Pki, ensure_binaries

pytestmark = pytest.mark.k8s


def test_pki_issues_loopback_serving_and_system_masters_client_certs(tmp_path: Path) -> None:
    pki = Pki(tmp_path)
    serving, _ = pki.issue("api", common_name="kube-apiserver", server=True)
    admin, _ = pki.issue("admin", common_name="admin", orgs=("system:masters",))
    server_cert = x509.load_pem_x509_certificate(serving.read_bytes())
    sans = server_cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in sans.get_values_for_type(x509.IPAddress)
    client_cert = x509.load_pem_x509_certificate(admin.read_bytes())
    orgs = client_cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    assert client_cert.issuer == pki.ca_cert.subject
    assert pki.sa_key_file.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")


async def test_cluster_serves_the_built_version(
    k8s_cluster: ClusterAccess, admin_api: k8s.ApiClient
) -> None:
    info = await k8s.VersionApi(admin_api).get_code()
    assert info.major == "1"
    if k8s_cluster.backend == "local":
        assert info.git_version == "v1.36.3"
    assert k8s_cluster.server.startswith(("https://127.", "https://localhost"))


@pytest.mark.slow
def test_control_plane_stops_without_orphans(tmp_path: Path) -> None:
    try:
        bin_dir = ensure_binaries(build=False)
    except Exception as e:
        from tests.conftest import skip_or_fail

        skip_or_fail(str(e))
        return
    plane = ControlPlane(bin_dir=bin_dir, workdir=tmp_path).start()
    pids = [p.pid for p in plane.processes.values()]
    assert len(pids) == 3
    plane.stop()
    assert plane.processes == {}
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
