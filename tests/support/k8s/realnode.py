"""A real Kubernetes node for tests: kubelet + containerd + runc + CNI bridge, on its own cluster.

Next to the test kubelet (``kubelet.py``: pods as bubblewrap process trees, fast), this is the
second backend: the kubelet of ``scripts/build-k8s.sh`` runs real containers from the images of
``scripts/build-images.sh`` through a private containerd. It has its own control plane (etcd,
kube-apiserver, kube-controller-manager as in ``rig.py``, plus kube-scheduler and kube-proxy),
so the test kubelet never binds its pods.

Everything it makes is private to one rig and removed on ``stop``: containerd's root, state and
socket under the work dir; a CNI bridge ``tpr<id>`` with a /24 taken from 10.200.0.0/16 that no
route of the machine uses (no masquerade, no default route: pods reach nothing outside), whose
gateway address is the node's address (the kubelet refuses a loopback node address) and the
apiserver's (pods reach it through the ``kubernetes`` Service: in-cluster config works); a
service /24 from 10.201.0.0/16 routed onto the bridge, whose ClusterIPs kube-proxy (nftables
mode, tables ``ip``/``ip6 kube-proxy``, one rig per machine) sends to pods; the
kubelet's cgroup root ``/torpor-rn-<id>`` in every cgroup v1 hierarchy; the kubelet's root dir and
pod logs under the work dir. The kubelet and containerd listen on 127.0.0.1 / a unix socket only.

What this cgroup v1 host needs (see docs in tests/k8s/README.md): ``failCgroupV1: false``,
``cgroupDriver: cgroupfs``, ``failSwapOn: false``; containerd ``restrict_oom_score_adj = true``
(root here lacks CAP_SYS_RESOURCE, so runc cannot set a negative oom_score_adj).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shared.bus.server import free_port, free_ports
from tests.support.k8s.rig import (
    BINARIES,
    REPO_ROOT,
    ClusterAccess,
    ClusterUnavailable,
    ControlPlane,
    ensure_binaries,
    spawn,
    stop_process,
)

IMAGES_SCRIPT = REPO_ROOT / "scripts" / "build-images.sh"
CNI_BIN = Path("/usr/lib/cni")
NODE_BINARIES = ("kubelet", "kube-scheduler", "kube-proxy")
CGROUP_V1 = Path("/sys/fs/cgroup")
POD_RANGE = ipaddress.ip_network("10.200.0.0/16")  # allocation pool of the rigs' pod /24s
SERVICE_RANGE = ipaddress.ip_network("10.201.0.0/16")  # ... and of their service /24s
# kube-proxy's nftables tables have fixed names (ip/ip6 "kube-proxy"): one real node with a
# kube-proxy per machine at a time; a second rig waits for this lock.
KUBE_PROXY_LOCK = Path("/run/lock/torpor-realnode-kube-proxy.lock")
# The deployed control plane's namespace: its ServiceAccounts' requests are audited.
AUDITED_NAMESPACES = ("torpor",)
# The names the manifests use, tagged onto the images built here (no registry is reachable).
IMAGE_ALIASES = {
    "sandbox-base": ("ghcr.io/torpor-dev/sandbox-base:latest",),
    "control-plane": ("ghcr.io/torpor-dev/control-plane:0.1.0",),
    "nats": ("docker.io/library/nats:2.15.1-alpine",),
}


@dataclass(frozen=True)
class RealNodeAccess:
    """How tests reach the real node's cluster."""

    cluster: ClusterAccess
    node_name: str
    pod_cidr: ipaddress.IPv4Network
    service_cidr: ipaddress.IPv4Network
    containerd_socket: Path
    audit_log: Path  # requests of AUDITED_NAMESPACES' ServiceAccounts (JSON lines)
    pod_logs: Path  # the kubelet's podLogsDir: <namespace>_<pod>_<uid>/<container>/<n>.log
    images: dict[str, str]  # short name -> the reference pods use (e.g. sandbox-base)
    started_in: float
    registry: str  # host:port of the rig's OCI registry (plain HTTP; containerd pulls from it);
    # "" when crane is not built (off CI only)
    image_archives: dict[str, Path] = field(default_factory=dict)  # short name -> OCI archive


def missing_prerequisites() -> list[str]:
    """What this machine lacks for a real node (empty when it can run one)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (containerd, CNI, cgroups)")
    for tool in ("containerd", "runc", "ctr", "buildah", "debootstrap", "go", "ip", "nft"):
        if shutil.which(tool) is None:
            missing.append(tool)
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_BIN / plugin).exists():
            missing.append(f"CNI plugin {CNI_BIN / plugin} (containernetworking-plugins)")
    if not (CGROUP_V1 / "memory").is_dir() and not (CGROUP_V1 / "cgroup.controllers").exists():
        missing.append("cgroups")
    return missing


def ensure_node_binaries(*, build: bool) -> Path:
    """The control plane's binaries plus kubelet and kube-scheduler; builds the missing ones."""
    return ensure_binaries(
        build=build,
        binaries=(*BINARIES, *NODE_BINARIES),
        missing="kubelet/kube-scheduler not built in {folder}: run scripts/build-k8s.sh",
    )


def images_folder() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get("TORPOR_IMAGES_CACHE", cache / "torpor" / "images"))


def read_images(folder: Path) -> dict[str, tuple[str, Path]]:
    listing = folder / "images.txt"
    if not listing.exists():
        return {}
    out: dict[str, tuple[str, Path]] = {}
    for line in listing.read_text().splitlines():
        short, ref, archive = line.split()
        out[short] = (ref, Path(archive))
    return out


def ensure_images(*, build: bool) -> dict[str, tuple[str, Path]]:
    """The built images (short name -> (reference, OCI archive)); builds them when ``build``."""
    if build:
        done = subprocess.run(
            ["bash", str(IMAGES_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        if done.returncode != 0:
            msg = f"scripts/build-images.sh failed ({done.returncode}): {done.stderr[-2000:]}"
            raise ClusterUnavailable(msg)
    images = read_images(images_folder())
    need = {"pause", "sandbox-base", "control-plane", "nats"}
    if not need <= images.keys() or not all(p.exists() for _, p in images.values()):
        msg = f"images not built in {images_folder()}: run scripts/build-images.sh"
        raise ClusterUnavailable(msg)
    return images


def pick_cidrs() -> tuple[ipaddress.IPv4Network, ipaddress.IPv4Network]:
    """A pod /24 of POD_RANGE and a service /24 of SERVICE_RANGE (same index) that no route and
    no address of this machine overlaps."""
    routes = json.loads(
        subprocess.run(["ip", "-j", "route"], capture_output=True, check=True).stdout
    )
    used = []
    for r in routes:
        dst = r.get("dst", "")
        if dst and dst != "default":
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(dst, strict=False))
    pairs = list(
        zip(POD_RANGE.subnets(new_prefix=24), SERVICE_RANGE.subnets(new_prefix=24), strict=True)
    )
    random.shuffle(pairs)
    for pods, services in pairs:
        if not any(pods.overlaps(u) or services.overlaps(u) for u in used):
            return pods, services
    raise ClusterUnavailable(f"no free /24 in {POD_RANGE} and {SERVICE_RANGE}")


def _cgroup_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies the kubelet uses (one folder per mounted controller set)."""
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] == "cgroup":
            out.append(Path(fields[4]))
    return out


def _remove_cgroup_tree(path: Path) -> None:
    if not path.is_dir():
        return
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            child.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


@dataclass
class RealNode:
    """containerd + kubelet (+ kube-scheduler) against a fresh control plane."""

    bin_dir: Path
    workdir: Path
    images: dict[str, tuple[str, Path]]
    registry_bin: Path | None = None  # None: no registry (off CI, crane not built)
    rig_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    plane: ControlPlane | None = None
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    pod_cidr: ipaddress.IPv4Network | None = None
    service_cidr: ipaddress.IPv4Network | None = None
    cgroups: list[Path] = field(default_factory=list)
    started_in: float = 0.0
    registry: str = ""
    _proxy_lock: Any = None
    _registry: Any = None

    @property
    def node_name(self) -> str:
        return f"torpor-real-{self.rig_id}"

    @property
    def bridge(self) -> str:
        return f"tpr{self.rig_id}"

    @property
    def cgroup_root(self) -> str:
        return f"/torpor-rn-{self.rig_id}"

    @property
    def socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def start(self, *, timeout: float = 420.0) -> RealNodeAccess:
        began = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock_kube_proxy(began + timeout)
            # the bridge first: the apiserver listens on its address (pods reach it there
            # through the kubernetes Service), the host on 127.0.0.1 stays private
            self.pod_cidr, self.service_cidr = pick_cidrs()
            self._make_bridge()
            # the control plane gets most of the budget: on a loaded machine it is the slow part
            self.plane = ControlPlane(
                bin_dir=self.bin_dir,
                workdir=self.workdir / "cp",
                bind_address=self.node_ip,
                service_cidr=str(self.service_cidr),
                audited_namespaces=AUDITED_NAMESPACES,
            ).start(timeout=timeout)
            self._start_scheduler()
            if self.registry_bin is not None:
                self._start_registry()
            self._start_containerd(began + timeout)
            self._import_images()
            self._start_kubelet(began + timeout)
            self._start_kube_proxy(began + timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        assert self.pod_cidr is not None
        assert self.service_cidr is not None
        return RealNodeAccess(
            cluster=ClusterAccess(
                kubeconfig=self.plane.kubeconfig,
                server=self.plane.server,
                backend="realnode",
                ca_file=self.plane.ca_file,
                started_in=self.plane.started_in,
            ),
            node_name=self.node_name,
            pod_cidr=self.pod_cidr,
            service_cidr=self.service_cidr,
            containerd_socket=self.socket,
            audit_log=self.plane.audit_log,
            pod_logs=self.workdir / "pod-logs",
            images={short: ref for short, (ref, _) in self.images.items()},
            started_in=self.started_in,
            registry=self.registry,
            image_archives={short: archive for short, (_, archive) in self.images.items()},
        )

    # ------------------------------------------------------------ pieces

    def _start_scheduler(self) -> None:
        assert self.plane is not None
        config = self.plane.kubeconfig
        self.processes["kube-scheduler"] = spawn(
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--kubeconfig={config}",
                f"--authentication-kubeconfig={config}",
                f"--authorization-kubeconfig={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--leader-elect=false",
                "--v=1",
            ],
            self.workdir / "kube-scheduler.log",
        )

    def _start_registry(self) -> None:
        """The rig's OCI registry (tests/support/k8s/registry.py): on 127.0.0.1, so containerd and the
        host's processes reach it and no pod does."""
        from tests.support.k8s.registry import run_registry

        assert self.registry_bin is not None
        self._registry = run_registry(self.registry_bin, self.workdir / "registry")
        self.registry = self._registry.__enter__().host

    def _ctr(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            msg = f"ctr {' '.join(args)} failed: {done.stderr.strip()[-1000:]}"
            raise ClusterUnavailable(msg)
        return done.stdout

    @property
    def node_ip(self) -> str:
        """The bridge's gateway address: the node's address (the kubelet rejects loopback)."""
        assert self.pod_cidr is not None
        return str(next(self.pod_cidr.hosts()))

    def _make_bridge(self) -> None:
        """The pods' bridge, made before the control plane starts so the node has its address;
        the CNI bridge plugin adopts it. The service /24 is routed onto it too, so a ClusterIP
        dialled from the host never leaves through the machine's default route (kube-proxy
        rewrites it to a pod or the apiserver first)."""
        assert self.pod_cidr is not None
        assert self.service_cidr is not None
        gateway = f"{self.node_ip}/{self.pod_cidr.prefixlen}"
        for argv in (
            ["ip", "link", "add", self.bridge, "type", "bridge"],
            ["ip", "addr", "add", gateway, "dev", self.bridge],
            ["ip", "link", "set", self.bridge, "up"],
            ["ip", "route", "add", str(self.service_cidr), "dev", self.bridge, "src", self.node_ip],
        ):
            done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=10)
            if done.returncode != 0:
                msg = f"{' '.join(argv)} failed: {done.stderr.strip()}"
                raise ClusterUnavailable(msg)

    def _start_containerd(self, deadline: float) -> None:
        assert self.pod_cidr is not None
        assert self.service_cidr is not None
        base = self.workdir / "containerd"
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-torpor.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": f"torpor-{self.rig_id}",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": self.bridge,
                            # the bridge gets the gateway address: the host (kubelet probes,
                            # tests) reaches pods; no masquerade and no default route, so pods
                            # reach nothing outside the bridge but the rig's Service addresses
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": str(self.pod_cidr)}]],
                                "routes": [{"dst": str(self.service_cidr), "gw": self.node_ip}],
                                "dataDir": str(self.workdir / "cni" / "ipam"),
                            },
                        }
                    ],
                }
            )
        )
        pause_ref = self.images["pause"][0]
        config = f"""version = 2
root = "{base / "root"}"
state = "{base / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{base / "containerd.sock.ttrpc"}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_ref}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{base / "certs.d"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{cni_conf}"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
"""
        base.mkdir(parents=True, exist_ok=True)
        (base / "config.toml").write_text(config)
        # the rig's registry speaks plain HTTP: say so for its host (hosts.toml, config_path)
        hosts = base / "certs.d" / (self.registry or "none")
        hosts.mkdir(parents=True, exist_ok=True)
        if self.registry:
            (hosts / "hosts.toml").write_text(
                f'server = "http://{self.registry}"\n\n'
                f'[host."http://{self.registry}"]\n  capabilities = ["pull", "resolve"]\n'
            )
        self.processes["containerd"] = spawn(
            ["containerd", "--config", str(base / "config.toml")],
            self.workdir / "containerd.log",
        )
        while not self.socket.exists():
            if self.processes["containerd"].poll() is not None or time.monotonic() > deadline:
                tail = (self.workdir / "containerd.log").read_text(errors="replace")[-3000:]
                raise ClusterUnavailable(f"containerd did not start:\n{tail}")
            time.sleep(0.1)
        self._ctr("version", timeout=30)

    def _import_images(self) -> None:
        for short, (ref, archive) in self.images.items():
            if short == "python":
                continue
            # Unpack now what pods run (the first pod would otherwise pay for it, and on a
            # loaded machine CreateContainer then hits the kubelet's deadline); the rest is
            # only stored.
            unpack = () if short in ("pause", "sandbox-base") else ("--no-unpack",)
            self._ctr("images", "import", *unpack, str(archive), timeout=900)
            for alias in IMAGE_ALIASES.get(short, ()):
                self._ctr("images", "tag", "--force", ref, alias)

    def _start_kubelet(self, deadline: float) -> None:
        assert self.plane is not None
        for hierarchy in _cgroup_hierarchies():
            folder = hierarchy / self.cgroup_root.lstrip("/")
            folder.mkdir(exist_ok=True)
            self.cgroups.append(folder)
            # cpuset children start empty in v1: give the root its parent's cpus and mems
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (hierarchy / knob).exists():
                    (folder / knob).write_text((hierarchy / knob).read_text())
        root = self.workdir / "kubelet"
        root.mkdir(parents=True, exist_ok=True)
        # At start-up the kubelet bind-mounts its root folder onto itself (shared propagation)
        # while, concurrently, it makes its pod-resources socket as a temporary file renamed into
        # place; a bind landing between the two fails the rename with EXDEV and the kubelet exits
        # (CI: "invalid cross-device link", every real-node test in error). Mounted here first,
        # the kubelet finds a shared mount and mounts nothing; stop() unmounts under the workdir.
        subprocess.run(["mount", "--bind", str(root), str(root)], check=True)
        subprocess.run(["mount", "--make-rshared", str(root)], check=True)
        resolv = self.workdir / "resolv.conf"
        resolv.write_text("# pods of the test rig resolve nothing outside\n")
        port, healthz = free_ports(2)
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # this host is cgroup v1: the kubelet refuses to start on v1 unless told otherwise
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "failSwapOn": False,
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": True,
            "address": "127.0.0.1",
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.plane.ca_file)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.socket}",
            "podLogsDir": str(self.workdir / "pod-logs"),
            "resolvConf": str(resolv),
            "clusterDomain": "cluster.local",
            "registerNode": True,
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            # The images are imported, not pulled. Once a pod pulled one of them by digest from
            # the rig's registry (same image id), the kubelet (KEP-2535) verified every later pod
            # of that image by pulling its alias, ghcr.io/torpor-dev/sandbox-base:latest, from
            # the internet: no pod of it started again (CI: test_k8s_cycle after the
            # template-image tests).
            "imagePullCredentialsVerificationPolicy": "NeverVerify",
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%"},
            "maxPods": 60,
            "nodeStatusUpdateFrequency": "2s",
            "syncFrequency": "5s",
            "fileCheckFrequency": "60s",
            "shutdownGracePeriod": "0s",
            # The deployed services crash-loop until the provisioning Job has made the bus
            # topology (deploy/README.md: expected, converges); cap the back-off so they come
            # back seconds after it, not minutes (KubeletCrashLoopBackOffMax, beta in 1.35+).
            "crashLoopBackOff": {"maxContainerRestartPeriod": "5s"},
            "protectKernelDefaults": False,
            "localStorageCapacityIsolation": True,
        }
        (self.workdir / "kubelet.yaml").write_text(yaml.safe_dump(config))
        self.processes["kubelet"] = spawn(
            [
                str(self.bin_dir / "kubelet"),
                f"--config={self.workdir / 'kubelet.yaml'}",
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--root-dir={root}",
                f"--cert-dir={root / 'pki'}",
                f"--hostname-override={self.node_name}",
                f"--node-ip={self.node_ip}",
                "--v=1",
            ],
            self.workdir / "kubelet.log",
        )
        self._wait_node_ready(deadline)

    def _lock_kube_proxy(self, deadline: float) -> None:
        import fcntl

        KUBE_PROXY_LOCK.parent.mkdir(parents=True, exist_ok=True)
        lock = KUBE_PROXY_LOCK.open("w")
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.close()
                    msg = f"another real node holds {KUBE_PROXY_LOCK} (its kube-proxy tables)"
                    raise ClusterUnavailable(msg) from None
                time.sleep(1)
        self._proxy_lock = lock  # only a rig holding the lock deletes the tables at stop
        # a crashed earlier rig may have left kube-proxy's tables behind
        self._delete_kube_proxy_tables()

    @staticmethod
    def _delete_kube_proxy_tables() -> None:
        for family in ("ip", "ip6"):
            subprocess.run(
                ["nft", "delete", "table", family, "kube-proxy"],
                capture_output=True,
                check=False,
                timeout=10,
            )

    def _start_kube_proxy(self, deadline: float) -> None:
        """kube-proxy (nftables mode): ClusterIPs of this rig's service /24 to their endpoints.

        Service traffic is masqueraded to the node's address (``masqueradeAll``), so a pod that
        dials a Service backed by a pod on the same bridge gets its replies back through the
        host. kube-proxy touches no sysctl here (conntrack limits 0 = leave as is; root lacks
        CAP_SYS_RESOURCE, so its own oom_score_adj stays 0)."""
        assert self.plane is not None
        assert self.pod_cidr is not None
        healthz, metrics = free_ports(2)
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "nftables",
            "clientConnection": {"kubeconfig": str(self.plane.kubeconfig)},
            "hostnameOverride": self.node_name,
            "bindAddress": self.node_ip,
            "healthzBindAddress": f"127.0.0.1:{healthz}",
            "metricsBindAddress": f"127.0.0.1:{metrics}",
            "clusterCIDR": str(self.pod_cidr),
            "detectLocalMode": "ClusterCIDR",
            "nodePortAddresses": [f"{self.node_ip}/32"],
            "oomScoreAdj": 0,
            "nftables": {"masqueradeAll": True, "syncPeriod": "30s", "minSyncPeriod": "0s"},
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        }
        (self.workdir / "kube-proxy.yaml").write_text(yaml.safe_dump(config))
        self.processes["kube-proxy"] = spawn(
            [
                str(self.bin_dir / "kube-proxy"),
                f"--config={self.workdir / 'kube-proxy.yaml'}",
                "--v=1",
            ],
            self.workdir / "kube-proxy.log",
        )
        import urllib.request

        # healthy once it has synced its rules at least once (the kubernetes Service included)
        while True:
            proc = self.processes["kube-proxy"]
            if proc.poll() is not None:
                tail = (self.workdir / "kube-proxy.log").read_text(errors="replace")[-3000:]
                raise ClusterUnavailable(f"kube-proxy exited with {proc.returncode}:\n{tail}")
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(  # loopback only
                    f"http://127.0.0.1:{healthz}/healthz", timeout=2
                ) as resp,
            ):
                if resp.status == 200:
                    return
            if time.monotonic() > deadline:
                tail = (self.workdir / "kube-proxy.log").read_text(errors="replace")[-3000:]
                raise ClusterUnavailable(f"kube-proxy not healthy in time:\n{tail}")
            time.sleep(0.5)

    def _api(self, method: str, path: str, body: object = None) -> Any:
        """One call to the rig's kube-apiserver (127.0.0.1) with the admin certificate."""
        assert self.plane is not None
        import ssl
        import urllib.request

        admin = self.plane.workdir / "pki"
        ctx = ssl.create_default_context(cafile=str(self.plane.ca_file))
        ctx.load_cert_chain(str(admin / "admin.crt"), str(admin / "admin.key"))
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.plane.server}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:  # loopback only
            return json.load(resp)

    def _wait_node_ready(self, deadline: float) -> None:
        while True:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise ClusterUnavailable(f"{name} exited with {proc.returncode}:\n{tail}")
            with contextlib.suppress(OSError, ValueError):
                node = self._api("GET", f"/api/v1/nodes/{self.node_name}")
                conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
                if conditions.get("Ready") == "True":
                    return
            if time.monotonic() > deadline:
                tail = (self.workdir / "kubelet.log").read_text(errors="replace")[-3000:]
                raise ClusterUnavailable(f"node {self.node_name} not Ready in time:\n{tail}")
            time.sleep(0.5)

    # ------------------------------------------------------------ teardown

    def stop(self) -> None:
        """Stop everything and remove what the rig made (containers, bridge, cgroups, mounts)."""
        if "kubelet" in self.processes:
            self._drain()
        if kubelet := self.processes.pop("kubelet", None):
            stop_process(kubelet)
        if "containerd" in self.processes:
            self._remove_containers()
        if kube_proxy := self.processes.pop("kube-proxy", None):
            stop_process(kube_proxy)
        if scheduler := self.processes.pop("kube-scheduler", None):
            stop_process(scheduler)
        if containerd := self.processes.pop("containerd", None):
            stop_process(containerd)
        self._kill_shims()
        self._unmount_under(self.workdir)
        if self.plane is not None:
            self.plane.stop()
        if self._registry is not None:
            self._registry.__exit__(None, None, None)
            self._registry = None
        subprocess.run(
            ["ip", "link", "del", self.bridge], capture_output=True, check=False, timeout=10
        )
        if self._proxy_lock is not None:
            self._delete_kube_proxy_tables()
            self._proxy_lock.close()  # releases the flock
            self._proxy_lock = None
        # the kubelet also makes its tree in the cgroup2 "unified" hierarchy of this hybrid host
        unified = CGROUP_V1 / "unified" / self.cgroup_root.lstrip("/")
        for folder in [*self.cgroups, unified]:
            _remove_cgroup_tree(folder)
        self.cgroups.clear()

    def _drain(self, timeout: float = 30.0) -> None:
        """Delete every pod on the node and let the kubelet stop them (CNI DEL, netns gone)."""
        selector = f"fieldSelector=spec.nodeName%3D{self.node_name}"
        deadline = time.monotonic() + timeout
        with contextlib.suppress(OSError, ValueError, ClusterUnavailable):
            for pod in self._api("GET", f"/api/v1/pods?{selector}")["items"]:
                meta = pod["metadata"]
                with contextlib.suppress(OSError, ValueError):
                    self._api(
                        "DELETE",
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        {"gracePeriodSeconds": 0},
                    )
            while time.monotonic() < deadline:
                # force-deleted pods leave the API at once; the kubelet still stops them
                if not self._ctr("tasks", "ls", "-q", timeout=30).split():
                    return
                time.sleep(0.5)

    def _remove_containers(self) -> None:
        """Pod sandboxes the kubelet left: tear down their network (CRI), kill and remove them."""
        with contextlib.suppress(ClusterUnavailable, subprocess.TimeoutExpired):
            listing = self._ctr("tasks", "ls", "-q", timeout=30).split()
            for task in listing:
                with contextlib.suppress(ClusterUnavailable, subprocess.TimeoutExpired):
                    self._ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=30)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                with contextlib.suppress(ClusterUnavailable, subprocess.TimeoutExpired):
                    for task in self._ctr("tasks", "ls", "-q", timeout=30).split():
                        self._ctr("tasks", "delete", task, timeout=30)
                    break
                time.sleep(0.5)
            for container in self._ctr("containers", "ls", "-q", timeout=30).split():
                with contextlib.suppress(ClusterUnavailable, subprocess.TimeoutExpired):
                    self._ctr("containers", "delete", container, timeout=30)
        # Network namespaces of sandboxes the kubelet did not stop (named cni-<uuid>) that hold
        # a veth on our bridge: delete them (which deletes the veth).
        netns_dir = Path("/var/run/netns")
        master = Path(f"/sys/class/net/{self.bridge}/brif")
        if master.is_dir() and netns_dir.is_dir():
            for ns in netns_dir.glob("cni-*"):
                if self._netns_on_bridge(ns.name):
                    subprocess.run(["ip", "netns", "del", ns.name], check=False)

    def _netns_on_bridge(self, ns: str) -> bool:
        """True when ``ns``'s eth0 peer is a port of this rig's bridge."""
        done = subprocess.run(
            ["ip", "-n", ns, "-j", "link", "show", "eth0"], capture_output=True, check=False
        )
        links = json.loads(done.stdout or b"[]")
        if not links:
            return False
        peer_index = links[0].get("link_index")
        brif = Path(f"/sys/class/net/{self.bridge}/brif")
        for port in brif.iterdir() if brif.is_dir() else ():
            index = (Path("/sys/class/net") / port.name / "ifindex").read_text().strip()
            if str(peer_index) == index:
                return True
        return False

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes serving our containerd (they outlive it)."""
        needle = str(self.socket).encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and needle in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)

    @staticmethod
    def _unmount_under(folder: Path) -> None:
        prefix = str(folder.resolve())
        mounts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point == prefix or point.startswith(prefix + "/"):
                mounts.append(point)
        for point in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)


@contextlib.contextmanager
def provide_real_node(workdir: Path, *, on_ci: bool) -> Iterator[RealNodeAccess]:
    """A real node on a fresh control plane; builds binaries and images on CI (or when asked)."""
    if missing := missing_prerequisites():
        raise ClusterUnavailable("real node needs: " + ", ".join(missing))
    build = on_ci or os.environ.get("TORPOR_BUILD_K8S", "") == "1"
    bin_dir = ensure_node_binaries(build=build)
    images = ensure_images(build=build or (images_folder() / "images.txt").exists())
    from tests.support.k8s.registry import registry_binary

    try:
        registry_bin: Path | None = registry_binary(build=build)
    except ClusterUnavailable:
        if on_ci:
            raise
        registry_bin = None  # the tests that need it skip (RealNodeAccess.registry is "")
    node = RealNode(bin_dir=bin_dir, workdir=workdir, images=images, registry_bin=registry_bin)
    access = node.start()
    try:
        yield access
    finally:
        node.stop()
