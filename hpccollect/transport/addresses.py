"""This host's addresses, as rank 0 and its ranks need them (an interface's, a route's, a host
name's), a free port, and the checks that refuse an address the ranks cannot reach."""

from __future__ import annotations

import fcntl
import socket
import struct

from hpccollect.errors import ArgumentTypeError, ArgumentValueError

__all__ = [
    "address_towards",
    "checked_addr",
    "free_port",
    "host_addresses",
    "interface_address",
    "interface_with",
    "resolve_host",
]

_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address
_WILDCARDS = ("", "0.0.0.0", "::", "[::]", "*")


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (``"lo"``, ``"eth0"``, ``"ib0"``)."""
    if not isinstance(name, str):
        raise ArgumentTypeError(f"interface must be a str such as 'eth0', got {name!r}")
    raw = name.encode()
    if raw and len(raw) < 16 and b"\0" not in raw:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", raw))
            except OSError as err:
                why = err.strerror or str(err)
            else:
                return socket.inet_ntoa(packed[20:24])
    else:
        why = "not an interface name"
    there = ", ".join(sorted(n for _, n in socket.if_nameindex())) or "none"
    raise ArgumentValueError(
        f"interface={name!r} has no IPv4 address on {socket.gethostname()} ({why}); the "
        f"interfaces here are: {there}. Pass one of them, or master_addr= an address."
    )


def interface_with(address: str) -> str | None:
    """The name of this host's interface whose IPv4 address is ``address`` (any of
    ``127.0.0.0/8``: loopback's), or None."""
    if address.startswith("127."):
        address = "127.0.0.1"
    for _, name in socket.if_nameindex():
        try:
            if interface_address(name) == address:
                return name
        except ArgumentValueError:
            continue
    return None


def address_towards(peer: str) -> str:
    """This host's address on the interface that reaches ``peer`` (an address or a name), as
    the kernel's routes choose it (connecting a UDP socket sends nothing)."""
    try:
        family = socket.AF_INET6 if ":" in peer else socket.AF_INET
        addr = peer if ":" in peer else socket.gethostbyname(peer)
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((addr, 9))
            return str(sock.getsockname()[0])
    except OSError as err:
        raise ArgumentValueError(
            f"{socket.gethostname()} has no route to {peer} ({err.strerror or err}): pass "
            "master_addr= (--master-addr) or interface= (--interface) with an address the "
            "other ranks reach."
        ) from err


def host_addresses() -> list[str]:
    """This host's IPv4 addresses other than loopback, one per interface that has one."""
    found = []
    for _, name in socket.if_nameindex():
        try:
            addr = interface_address(name)
        except ArgumentValueError:
            continue
        if not addr.startswith("127.") and addr not in found:
            found.append(addr)
    return found


def free_port(host: str) -> int:
    """A TCP port free on ``host`` now, which another process may take before it is bound
    again: bind ``port=0`` yourself where you can."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError as err:
            raise ArgumentValueError(
                f"cannot listen on {host!r} ({err.strerror or err}): pass an address of this "
                "host as master_addr (or interface=)."
            ) from err
        return int(sock.getsockname()[1])


def checked_addr(addr: str, name: str) -> str:
    """``addr`` stripped, refused when it is not a string or a wildcard (``0.0.0.0``), as the
    ranks connect to it (``name``: the argument it came from)."""
    if not isinstance(addr, str):
        raise ArgumentTypeError(f"{name} must be a str (an address or host name), got {addr!r}")
    if addr.strip() in _WILDCARDS:
        raise ArgumentValueError(
            f"{name}={addr!r} is not an address rank 0 can be reached at (a wildcard would "
            "listen on every interface): give one address of rank 0's host, or an interface."
        )
    return addr.strip()


def resolve_host(host: str, what: str) -> str:
    """``host``'s address, refused when it is loopback: the job spans several nodes."""
    try:
        addr = socket.gethostbyname(host)
    except OSError as err:
        raise ArgumentValueError(
            f"cannot resolve {what} ({err}): pass master_addr= or interface=."
        ) from err
    if addr.startswith("127."):
        raise ArgumentValueError(
            f"{what} resolves to the loopback address {addr} on {socket.gethostname()}, which "
            "the ranks on other nodes cannot reach: pass master_addr= or interface= (e.g. eth0)."
        )
    return addr
