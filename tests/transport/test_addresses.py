"""This host's addresses (``transport/addresses.py``), on this machine's real interfaces."""

from __future__ import annotations

import socket

import pytest

from hpccollect.errors import ArgumentTypeError, ArgumentValueError
from hpccollect.transport.addresses import (
    address_towards,
    checked_addr,
    free_port,
    host_addresses,
    interface_address,
    interface_with,
    resolve_host,
)


def test_interface_address():
    assert interface_address("lo") == "127.0.0.1"
    names = [name for _, name in socket.if_nameindex()]
    with pytest.raises(ArgumentValueError) as info:
        interface_address("nosuchif0")
    message = str(info.value)
    assert "interface='nosuchif0'" in message and all(name in message for name in names)
    with pytest.raises(ArgumentValueError, match="not an interface name"):
        interface_address("x" * 20)


def test_the_interface_with_an_address_is_named_and_none_for_another_hosts():
    assert interface_with("127.0.0.1") == interface_with("127.0.0.9") == "lo"
    for _, name in socket.if_nameindex():
        try:
            addr = interface_address(name)
        except ArgumentValueError:  # no IPv4 address
            continue
        assert interface_with(addr) in (name, "lo" if addr.startswith("127.") else name)
    assert interface_with("192.0.2.1") is None  # TEST-NET-1: no host here has it


def test_free_port_can_be_bound():
    port = free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
    with pytest.raises(ArgumentValueError, match=r"cannot listen on '192.0.2.1'"):
        free_port("192.0.2.1")  # TEST-NET-1: an address no host here has


def test_the_address_towards_a_peer_is_the_routes():
    assert address_towards("127.0.0.1") == "127.0.0.1"
    for mine in host_addresses():  # a packet to one of our own addresses leaves from it
        assert address_towards(mine) == mine
    assert not [a for a in host_addresses() if a.startswith("127.")]


def test_a_wildcard_or_a_loopback_name_is_refused_naming_the_argument():
    assert checked_addr(" 10.0.0.1 ", "master_addr") == "10.0.0.1"
    for wildcard in ("0.0.0.0", "::", "*", ""):
        with pytest.raises(ArgumentValueError, match="master_addr=.*wildcard"):
            checked_addr(wildcard, "master_addr")
    with pytest.raises(ArgumentTypeError, match="MASTER_ADDR must be a str"):
        checked_addr(3, "MASTER_ADDR")  # type: ignore[arg-type]
    with pytest.raises(ArgumentValueError, match="loopback address 127"):
        resolve_host("localhost", "the first host")
