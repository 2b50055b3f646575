"""``free_ports``: the ports ``torpor up`` and the test stacks hand to services before those bind
them. Picked one at a time, the kernel gives the same port twice in about 1 of 300 sets of ten;
the second service to bind it then crash-loops (CI: a placeholder ``torpor up`` never ready)."""

from __future__ import annotations

import socket

from shared.bus.server import free_port, free_ports


def test_a_set_of_ports_never_repeats_one() -> None:
    for _ in range(2000):  # one at a time, ~6 of these sets would repeat a port
        ports = free_ports(10)
        assert len(set(ports)) == 10, ports


def test_ports_planned_for_others_are_never_picked() -> None:
    planned = set(free_ports(8))
    for _ in range(300):
        assert not planned & set(free_ports(10, avoid=planned))
        assert free_port(avoid=planned) not in planned


def test_picked_ports_can_be_bound_at_once() -> None:
    sockets = []
    try:
        for port in free_ports(10):
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", port))
    finally:
        for s in sockets:
            s.close()
