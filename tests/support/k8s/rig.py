"""A real Kubernetes control plane for tests: etcd + kube-apiserver + kube-controller-manager.

The binaries come from ``scripts/build-k8s.sh`` (Go modules, no Docker). Everything listens on
127.0.0.1 with free ports; certificates and the service-account key are throw-away, generated
here with ``cryptography``. ``provide_cluster`` picks the first available backend: an existing
cluster (``TORPOR_TEST_KUBECONFIG``), the local binaries, or testcontainers' k3s.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from shared.bus.server import free_port, free_ports

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-k8s.sh"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")


class ClusterUnavailable(Exception):
    """No backend could provide a cluster; the message says why."""


@dataclass(frozen=True)
class ClusterAccess:
    """How tests reach the cluster."""

    kubeconfig: Path
    server: str
    backend: str  # "existing" | "local" | "k3s"
    ca_file: Path | None = None
    started_in: float = 0.0  # seconds the control plane took to become ready


# ---------------------------------------------------------------- binaries


def k8s_bin_dir() -> Path:
    """Where build-k8s.sh puts the binaries (same defaults as the script)."""
    if explicit := os.environ.get("TORPOR_K8S_BIN"):
        return Path(explicit)
    version = os.environ.get("TORPOR_K8S_VERSION", "1.36.3")
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "torpor" / "k8s" / f"v{version}"


def ensure_binaries(
    *,
    build: bool,
    binaries: tuple[str, ...] = BINARIES,
    missing: str = "kube binaries not built in {folder}: run scripts/build-k8s.sh (20-35 min cold)",
) -> Path:
    """The binaries' folder; runs the (idempotent, slow when cold) build when ``build``.
    ``binaries`` are the ones that must be there; ``missing`` the error when they are not."""
    folder = k8s_bin_dir()
    if all(os.access(folder / b, os.X_OK) for b in binaries):
        return folder
    if not build:
        raise ClusterUnavailable(missing.format(folder=folder))
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3 * 3600, check=False
    )
    if done.returncode != 0:
        msg = f"scripts/build-k8s.sh failed ({done.returncode}): {done.stderr[-2000:]}"
        raise ClusterUnavailable(msg)
    return Path(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- certificates


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """Signatures only; a CA's key signs certificates and CRLs too."""
    return x509.KeyUsage(
        digital_signature=True,
        key_cert_sign=ca,
        crl_sign=ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass
class Pki:
    """One throw-away CA signing the serving cert and client certs, plus the SA signing key."""

    folder: Path
    ca_key: ec.EllipticCurvePrivateKey = field(init=False)
    ca_cert: x509.Certificate = field(init=False)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "torpor-test-ca")])
        now = dt.datetime.now(dt.UTC)
        self.ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                _key_usage(ca=True),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.ca_key.public_key()), critical=False
            )
            .sign(self.ca_key, hashes.SHA256())
        )
        self.ca_file.write_bytes(_pem_cert(self.ca_cert))
        sa_key = ec.generate_private_key(ec.SECP256R1())
        self.sa_key_file.write_bytes(_pem_key(sa_key))
        self.sa_pub_file.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def sa_key_file(self) -> Path:
        return self.folder / "sa.key"

    @property
    def sa_pub_file(self) -> Path:
        return self.folder / "sa.pub"

    def issue(
        self,
        stem: str,
        *,
        common_name: str,
        orgs: tuple[str, ...] = (),
        server: bool = False,
        ips: tuple[str, ...] = (),
    ) -> tuple[Path, Path]:
        """Write ``<stem>.crt``/``<stem>.key``; a serving cert is valid for 127.0.0.1/localhost
        and ``ips``."""
        key = ec.generate_private_key(ec.SECP256R1())
        attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        now = dt.datetime.now(dt.UTC)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self.ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                _key_usage(ca=False),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.ca_key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [
                        x509.DNSName("localhost"),
                        x509.DNSName("kubernetes.default.svc"),
                        *(
                            x509.IPAddress(ipaddress.ip_address(ip))
                            for ip in dict.fromkeys(("127.0.0.1", *ips))
                        ),
                    ]
                ),
                critical=False,
            )
        cert = builder.sign(self.ca_key, hashes.SHA256())
        crt, pem = self.folder / f"{stem}.crt", self.folder / f"{stem}.key"
        crt.write_bytes(_pem_cert(cert))
        pem.write_bytes(_pem_key(key))
        pem.chmod(0o600)
        return crt, pem


def write_kubeconfig(path: Path, *, server: str, ca: Path, cert: Path, key: Path) -> Path:
    def b64(p: Path) -> str:
        return base64.b64encode(p.read_bytes()).decode()

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "torpor-test",
                "cluster": {"server": server, "certificate-authority-data": b64(ca)},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
            }
        ],
        "contexts": [
            {"name": "torpor-test", "context": {"cluster": "torpor-test", "user": "admin"}}
        ],
        "current-context": "torpor-test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------- processes


def _die_with_parent() -> None:
    # If pytest is killed, the kernel kills the control plane too: no orphans.
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, no locks taken
        )


def stop_process(proc: subprocess.Popen[bytes], *, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager from ``bin_dir`` under ``workdir``.

    By default the apiserver listens on 127.0.0.1 and no ``kubernetes`` Service endpoint exists
    (nothing in a pod can dial it). The real node passes ``bind_address`` (its bridge's
    address, a network the rig made) and its own ``service_cidr``: then the apiserver maintains
    the ``kubernetes`` endpoint, pods reach it through kube-proxy (in-cluster config), and
    anonymous requests are refused (401) since pods on the bridge can connect to it.
    """

    bin_dir: Path
    workdir: Path
    bind_address: str = "127.0.0.1"
    service_cidr: str = "10.96.0.0/16"
    # ServiceAccounts of these namespaces get an audit trail (``audit.log``, one JSON event per
    # request: who did what, with which answer), so a test can tell which identity acted
    audited_namespaces: tuple[str, ...] = ()
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    api_port: int = 0
    started_in: float = 0.0

    @property
    def server(self) -> str:
        return f"https://{self.bind_address}:{self.api_port}"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    def _audit_flags(self) -> list[str]:
        if not self.audited_namespaces:
            return []
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                {
                    "level": "Metadata",
                    "userGroups": [
                        f"system:serviceaccounts:{ns}" for ns in self.audited_namespaces
                    ],
                },
                {"level": "None"},
            ],
        }
        path = self.workdir / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        return [
            f"--audit-policy-file={path}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            "--audit-log-mode=blocking",
        ]

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.bind_address).is_loopback

    @property
    def kubernetes_service_ip(self) -> str:
        """The ``kubernetes`` Service's ClusterIP: the first address of the service range."""
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def ca_file(self) -> Path:
        return self.workdir / "pki" / "ca.crt"

    def start(self, *, timeout: float = 120.0) -> ControlPlane:
        began = time.monotonic()
        deadline = began + timeout
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._start(deadline)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _start(self, deadline: float) -> None:
        pki = Pki(self.workdir / "pki")
        serving = pki.issue(
            "apiserver",
            common_name="kube-apiserver",
            server=True,
            ips=(self.bind_address, self.kubernetes_service_ip),
        )
        admin = pki.issue("admin", common_name="torpor-test-admin", orgs=("system:masters",))
        kcm = pki.issue("kcm", common_name="system:kube-controller-manager")
        etcd_port, peer_port, self.api_port = free_ports(3)
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self.processes["etcd"] = spawn(
            [
                str(self.bin_dir / "etcd"),
                "--name=torpor-test",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=torpor-test={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            self.workdir / "etcd.log",
        )
        self._wait_http(f"{etcd_url}/health", deadline, "etcd")
        self.processes["kube-apiserver"] = spawn(
            [
                str(self.bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={self.bind_address}",
                f"--advertise-address={self.bind_address}",
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={serving[0]}",
                f"--tls-private-key-file={serving[1]}",
                f"--client-ca-file={pki.ca_file}",
                "--authorization-mode=RBAC",
                "--allow-privileged=true",
                f"--service-account-issuer={self.server}",
                f"--service-account-key-file={pki.sa_pub_file}",
                f"--service-account-signing-key-file={pki.sa_key_file}",
                # loopback: allocation data only, nothing ever dials into this range; the real
                # node routes its own range (kube-proxy) and needs the kubernetes endpoint
                f"--service-cluster-ip-range={self.service_cidr}",
                f"--endpoint-reconciler-type={'none' if self.loopback else 'lease'}",
                f"--anonymous-auth={'true' if self.loopback else 'false'}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                *self._audit_flags(),
                "--v=1",
            ],
            self.workdir / "kube-apiserver.log",
        )
        write_kubeconfig(
            self.kubeconfig, server=self.server, ca=pki.ca_file, cert=admin[0], key=admin[1]
        )
        kcm_config = write_kubeconfig(
            self.workdir / "kcm.kubeconfig",
            server=self.server,
            ca=pki.ca_file,
            cert=kcm[0],
            key=kcm[1],
        )
        ctx = ssl.create_default_context(cafile=str(pki.ca_file))
        ctx.load_cert_chain(str(admin[0]), str(admin[1]))
        self._wait_http(f"{self.server}/readyz", deadline, "kube-apiserver", ctx)
        self.processes["kube-controller-manager"] = spawn(
            [
                str(self.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kcm_config}",
                f"--authentication-kubeconfig={kcm_config}",
                f"--authorization-kubeconfig={kcm_config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={self.workdir / 'kcm-certs'}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--root-ca-file={pki.ca_file}",
                f"--service-account-private-key-file={pki.sa_key_file}",
                "--v=1",
            ],
            self.workdir / "kube-controller-manager.log",
        )
        # The controller manager is up when it has created the default namespace's ServiceAccount.
        self._wait_http(
            f"{self.server}/api/v1/namespaces/default/serviceaccounts/default",
            deadline,
            "kube-controller-manager",
            ctx,
        )

    def _wait_http(
        self, url: str, deadline: float, what: str, ctx: ssl.SSLContext | None = None
    ) -> None:
        while True:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                    msg = f"{name} exited with {proc.returncode}:\n{tail}"
                    raise ClusterUnavailable(msg)
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:  # loopback only
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                msg = f"{what} not ready at {url} in time; logs in {self.workdir}"
                raise ClusterUnavailable(msg)
            time.sleep(0.2)

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            if proc := self.processes.pop(name, None):
                stop_process(proc)


# ---------------------------------------------------------------- backends


def _docker_available() -> bool:
    if shutil.which("docker") is None and not Path("/var/run/docker.sock").exists():
        return False
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return False
    return True


@contextlib.contextmanager
def provide_cluster(workdir: Path, *, on_ci: bool) -> Iterator[ClusterAccess]:
    """An existing cluster, the local binaries, or k3s in Docker, in that order.

    On CI only the local binaries count (and are built if missing); elsewhere a missing build
    falls through to k3s, then to ``ClusterUnavailable``.
    """
    if explicit := os.environ.get("TORPOR_TEST_KUBECONFIG"):
        path = Path(explicit)
        server = yaml.safe_load(path.read_text())["clusters"][0]["cluster"]["server"]
        yield ClusterAccess(kubeconfig=path, server=server, backend="existing")
        return
    build = on_ci or os.environ.get("TORPOR_BUILD_K8S", "") == "1"
    try:
        bin_dir = ensure_binaries(build=build)
    except ClusterUnavailable as local_missing:
        if on_ci or not _docker_available():
            raise
        with _k3s(workdir) as access:
            yield access
        del local_missing
        return
    plane = ControlPlane(bin_dir=bin_dir, workdir=workdir).start()
    try:
        yield ClusterAccess(
            kubeconfig=plane.kubeconfig,
            server=plane.server,
            backend="local",
            ca_file=plane.ca_file,
            started_in=plane.started_in,
        )
    finally:
        plane.stop()


@contextlib.contextmanager
def _k3s(workdir: Path) -> Iterator[ClusterAccess]:
    from testcontainers.community.k3s import K3SContainer

    with K3SContainer() as k3s:
        config_text = k3s.config_yaml()
        path = workdir / "k3s.kubeconfig"
        path.write_text(config_text)
        server = yaml.safe_load(config_text)["clusters"][0]["cluster"]["server"]
        yield ClusterAccess(kubeconfig=path, server=server, backend="k3s")
