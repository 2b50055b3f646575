"""One runtime instance's pod network: claim a range, give each pod a namespace and rules, clean up.

A pod's address is ``range[slot]`` (slot ≥ 2; ``range[1]`` is the gateway, the host side of
every link). The runtime keeps a workload's slot reserved while it is paused, so no other pod
gets its address. Everything here is idempotent and keyed by instance-scoped names
(:mod:`.names`), so a runtime restarted after ``kill -9`` adopts what its pods still use and
removes only its own leftovers.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import os
import shutil
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import structlog

from shared.errors import ConfigError, RuntimeFailure
from shared.models.network import NetworkPolicy
from shared.runtime.local.network import guard, links, nftables, subnet
from shared.runtime.local.network.commands import run
from shared.runtime.local.network.names import MAX_SLOTS, InstanceNames

log = structlog.get_logger()

IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")


class PodNetwork:
    def __init__(
        self, data_dir: Path, *, pod_cidr: str = subnet.AUTO, ip: str = "ip", nft: str = "nft"
    ) -> None:
        self._data_dir = data_dir.resolve()
        self.names = InstanceNames.for_data_dir(self._data_dir)
        self._setting = subnet.parse_setting(pod_cidr)
        self._ip = ip
        self._nft = nft
        self._subnet: ipaddress.IPv4Network | None = None

    # ---- the range --------------------------------------------------------------------

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        if self._subnet is None:
            msg = "pod network used before open()"
            raise RuntimeFailure(msg)
        return self._subnet

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return self.subnet[1]

    def slots(self) -> range:
        """Slots that can hold a pod (not the network, gateway or broadcast address)."""
        return range(2, min(self.subnet.num_addresses - 1, MAX_SLOTS + 1))

    def address(self, slot: int) -> str:
        return str(self.subnet[slot])

    def slot_of(self, address: str) -> int | None:
        """The slot of ``address``, or ``None`` when it is not a pod address of this range."""
        try:
            ip = ipaddress.IPv4Address(address)
        except ValueError:
            return None
        if ip not in self.subnet:
            return None
        slot = int(ip) - int(self.subnet.network_address)
        return slot if slot in self.slots() else None

    async def open(self) -> PodNetwork:
        """Adopt the instance's range (its table survives a ``kill -9``) or claim a new one."""
        for tool in (self._ip, self._nft, "nsenter"):
            if shutil.which(tool) is None:
                msg = f"the local runtime's pod network needs `{tool}`: {_HINT}"
                raise ConfigError(msg)
        if os.geteuid() != 0:
            msg = f"the local runtime's pod network needs root (namespaces, nftables): {_HINT}"
            raise ConfigError(msg)
        async with self._instance_lock():
            listing = await self._list_table()
            found = nftables.subnet_of(listing) if listing is not None else None
            if found is not None:
                self._subnet = found
                if self._setting is not None and self._setting != found:
                    log.warning(
                        "runtime_local_network_kept_range",
                        range=str(found),
                        setting=str(self._setting),
                        reason="pods of the last run may still use it; stop them to change it",
                    )
                live = guard.script(found) + guard.unmark_released(self.names.link_glob)
                await run([self._nft, "-f", "-"], stdin=live)
                await run([self._ip, "route", "replace", "unreachable", str(found)])
            else:
                self._subnet = await self._claim()
        await asyncio.to_thread(_enable_forwarding)
        log.info("runtime_local_network_open", range=str(self._subnet), table=self.names.table)
        await self._release_dead_instances()
        return self

    async def _release_dead_instances(self) -> None:
        """Release the network of other instances whose data dir is gone and whose pods are all
        gone: what a killed run left before its folder was deleted (a test's temporary data
        dir), which no runtime of its own would ever sweep. The data dir in the table's comment
        counts only when it hashes to the table's id (exactly that path, not cut short)."""
        tables = await run([self._nft, "list", "tables"], check=False)
        for instance in nftables.instances_of(tables.stdout):
            if instance == self.names.instance:
                continue
            names = InstanceNames(instance=instance)
            listed = await run([self._nft, "list", "table", "inet", names.table], check=False)
            label = nftables.label_of(listed.stdout) if listed.returncode == 0 else None
            if label is None or not label.startswith("/"):
                continue
            data_dir = Path(label)
            if InstanceNames.for_data_dir(data_dir) != names or await asyncio.to_thread(
                data_dir.exists
            ):
                continue
            if any(
                [await links.netns_in_use(self._ip, n) for n in links.own_netns(names.netns_prefix)]
            ):
                continue
            log.info("runtime_local_network_dead_instance", table=names.table, data_dir=label)
            await PodNetwork(data_dir, ip=self._ip, nft=self._nft).release()

    async def _claim(self) -> ipaddress.IPv4Network:
        routes = await run([self._ip, "-j", "-4", "route", "show", "table", "all"])
        addresses = await run([self._ip, "-j", "-4", "addr", "show"])
        taken = subnet.host_networks(routes.stdout, addresses.stdout)
        for candidate in subnet.candidates(self._setting):
            hit = subnet.overlap(candidate, taken)
            if hit is not None:
                if self._setting is not None:
                    msg = (
                        f"TORPOR_POD_CIDR {candidate} overlaps {hit}, already routed on this host "
                        "(another torpor instance or a host network): choose another range"
                    )
                    raise ConfigError(msg)
                continue
            script = nftables.table_script(
                self.names, candidate, str(self._data_dir), {}, replace=True
            )
            await run([self._nft, "-f", "-"], stdin=script)
            added = await run(
                [self._ip, "route", "add", "unreachable", str(candidate)], check=False
            )
            if added.returncode == 0:
                log.info("runtime_local_network_claimed", range=str(candidate))
                return candidate
            await run([self._nft, "delete", "table", "inet", self.names.table], check=False)
            if self._setting is not None:  # claimed by another instance a moment ago
                msg = f"TORPOR_POD_CIDR {candidate} is in use by another torpor instance"
                raise ConfigError(msg)
        msg = f"no free /{subnet.AUTO_PREFIX} left in {subnet.POOL} for pods: set TORPOR_POD_CIDR"
        raise ConfigError(msg)

    @contextlib.asynccontextmanager
    async def _instance_lock(self) -> AsyncIterator[None]:
        """Serialises claims by the processes of one instance (they share the data dir)."""
        self._data_dir.mkdir(parents=True, exist_ok=True)
        async with _flocked(self._data_dir / "network.lock", fcntl.LOCK_EX):
            yield

    @contextlib.asynccontextmanager
    async def address_lock(self, address: str) -> AsyncIterator[None]:
        """Held while a pod is started at ``address``: the processes of one instance (several
        services may each run a reconciler) never start two pods at one address, and no
        ``sweep_lock`` holder takes a starting pod's namespace for a leftover."""
        folder = self._lock_dir()
        path = folder / f"{ipaddress.IPv4Address(address)}.lock"
        async with _flocked(folder / "sweep.lock", fcntl.LOCK_SH), _flocked(path, fcntl.LOCK_EX):
            yield

    @contextlib.asynccontextmanager
    async def sweep_lock(self) -> AsyncIterator[None]:
        """Held while leftovers are found and removed: no pod of another process of the
        instance is between its namespace's creation and its record then (a runtime starting
        beside one that fills its pool once swept that one's fresh namespace)."""
        async with _flocked(self._lock_dir() / "sweep.lock", fcntl.LOCK_EX):
            yield

    def _lock_dir(self) -> Path:
        folder = self._data_dir / "network"
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    async def _list_table(self) -> str | None:
        listed = await run([self._nft, "list", "table", "inet", self.names.table], check=False)
        return listed.stdout if listed.returncode == 0 else None

    # ---- pods -------------------------------------------------------------------------
    # A pod's network objects are named by its net id (names.pod_net_id), its address is the
    # workload's: a pod being removed never takes down a newer pod of the same workload.

    def netns_path(self, net_id: str) -> Path:
        return links.netns_path(self.names.netns(net_id))

    def enter_prefix(self, net_id: str) -> list[str]:
        """Argv prefix that runs the rest of a command line inside the pod's namespace."""
        return ["nsenter", f"--net={self.netns_path(net_id)}", "--"]

    async def setup(self, net_id: str, address: str, policy: NetworkPolicy) -> None:
        """Namespace, link, routes and rules of one pod."""
        names = self.names
        try:
            await links.create(
                self._ip,
                netns=names.netns(net_id),
                link=names.link(net_id),
                address=address,
                gateway=self.gateway,
            )
            await self.apply_policy(net_id, address, policy)
        except RuntimeFailure:
            await self.teardown(net_id, address)
            raise

    async def apply_policy(self, net_id: str, address: str, policy: NetworkPolicy) -> None:
        """Replace the pod's egress rules (one atomic nft transaction, which also restores the
        guard should anything have deleted it)."""
        script = nftables.egress_rules(self.names, net_id, address, policy)
        await run([self._nft, "-f", "-"], stdin=guard.script(self.subnet) + script)

    async def teardown(self, net_id: str, address: str) -> None:
        names = self.names
        await run(
            [self._nft, "-f", "-"],
            stdin=guard.script(self.subnet) + nftables.remove_pod(names, net_id, address),
            check=False,  # the table is gone already: nothing to remove
        )
        await links.remove(self._ip, netns=names.netns(net_id), link=names.link(net_id))

    async def sweep(self, keep: Mapping[str, tuple[str, NetworkPolicy]]) -> None:
        """Make the host match ``keep`` (net id → address and policy of each live pod):
        rebuild the table atomically, remove every other link and namespace of the instance."""
        script = nftables.table_script(
            self.names, self.subnet, str(self._data_dir), keep, replace=True
        )
        await run([self._nft, "-f", "-"], stdin=script)
        await self._remove_links(keep)

    async def _remove_links(self, keep: Mapping[str, object]) -> None:
        names = self.names
        ids = {names.id_of_link(n) for n in links.own_links(names.link_prefix)}
        ids |= {names.id_of_netns(n) for n in links.own_netns(names.netns_prefix)}
        for net_id in sorted(i for i in ids if i is not None and i not in keep):
            log.info("runtime_local_network_leftover_removed", net_id=net_id)
            await links.remove(self._ip, netns=names.netns(net_id), link=names.link(net_id))

    async def release(self) -> None:
        """Remove everything of this instance: links, namespaces, the range's route, the table
        (what ``close()`` and ``torpor up`` run after the last pod stopped)."""
        if shutil.which(self._ip) is None or shutil.which(self._nft) is None:
            return
        listing = await self._list_table()
        claimed = nftables.subnet_of(listing) if listing is not None else None
        table = self.names.table
        # One transaction: from the moment the table is gone, the instance's links pass nothing
        # (also links a process of the instance still running makes afterwards); the guard
        # stays for the other instances and keeps the range among its pod ranges.
        released = (
            guard.script(claimed or subnet.POOL)
            + guard.mark_released(self.names.link_glob)
            + f"add table inet {table}\ndelete table inet {table}\n"
        )
        await run([self._nft, "-f", "-"], stdin=released, check=False)
        await self._remove_links({})
        if claimed is not None:
            await run([self._ip, "route", "del", "unreachable", str(claimed)], check=False)
        if listing is not None:
            log.info("runtime_local_network_released", range=str(claimed), table=table)


async def release_instance(data_dir: Path) -> None:
    await PodNetwork(data_dir).release()


_HINT = "apt-get install -y iproute2 nftables util-linux, and run as root"


def _enable_forwarding() -> None:
    """Pods reach the outside through NAT, which needs IPv4 forwarding (as Docker and Podman
    do); the instance's ``forward`` chain rejects everything else towards or from its pods."""
    try:
        if IP_FORWARD.read_text().strip() != "1":
            IP_FORWARD.write_text("1")
            log.info("runtime_local_network_forwarding_enabled")
    except OSError as e:
        msg = f"cannot enable IPv4 forwarding ({e.strerror}): pods would have no egress"
        raise ConfigError(msg) from e


@contextlib.asynccontextmanager
async def _flocked(path: Path, mode: int) -> AsyncIterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, mode)
        yield
    finally:
        os.close(fd)  # also releases the lock
