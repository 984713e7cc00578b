"""Which addresses a server-side fetch may reach: public unicast only, whatever form the host takes."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str], Awaitable[list[str]]]
"""`host -> addresses`; the default asks the system resolver, tests pass a stub."""

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class BlockedAddress(PermissionError):
    """The URL points at an address a server-side fetch must never reach."""


async def system_resolver(host: str) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def parse_ip_literal(host: str) -> IPAddress | None:
    """An IP written in any form a resolver would accept: dotted, hex, octal, a bare integer, [v6]."""
    host = host.strip().strip("[]")
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    return _inet_aton(host)


def _inet_aton(host: str) -> ipaddress.IPv4Address | None:
    """The legacy inet_aton forms: `0x7f000001`, `2130706433`, `0177.0.0.1`, `127.1`."""
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(parts):
        return None
    try:
        numbers = [
            int(p, 16) if p.lower().startswith("0x") else _octal_or_decimal(p) for p in parts
        ]
    except ValueError:
        return None
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        return None
    value = 0
    for n in head:
        value = value * 256 + n
    value = value * 256 ** (5 - len(numbers)) + last
    return ipaddress.IPv4Address(value) if value < 2**32 else None


def _octal_or_decimal(part: str) -> int:
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8)
    if not part.isdigit():
        msg = "not a number"
        raise ValueError(msg)
    return int(part)


def refusal_reason(ip: IPAddress) -> str | None:
    """Why this address is not public, or None when a fetch may connect to it."""
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if ip in _NAT64 or ip in _NAT64_LOCAL:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = refusal_reason(embedded)
            return f"embeds {embedded} ({inner})" if inner else "embedded IPv4 address"
    checks = [
        (ip.is_unspecified, "unspecified"),
        (ip.is_loopback, "loopback"),
        (ip.is_link_local, "link-local"),
        (ip.is_multicast, "multicast"),
        (ip.is_reserved, "reserved"),
        (isinstance(ip, ipaddress.IPv4Address) and ip in _CGNAT, "carrier-grade NAT"),
        (ip.is_private, "private"),
        (not ip.is_global, "not globally routable"),
    ]
    return next((reason for hit, reason in checks if hit), None)


async def vetted_addresses(host: str, resolver: Resolver) -> list[IPAddress]:
    """Every address the host resolves to, all public, or BlockedAddress (one bad one spoils all)."""
    if not host:
        msg = "the URL has no host"
        raise BlockedAddress(msg)
    literal = parse_ip_literal(host)
    if literal is not None:
        addresses: list[IPAddress] = [literal]
    else:
        try:
            raw = await resolver(host.rstrip("."))
        except OSError as exc:
            msg = f"could not resolve {host}: {exc}"
            raise BlockedAddress(msg) from None
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in raw]
    if not addresses:
        msg = f"{host} has no addresses"
        raise BlockedAddress(msg)
    for ip in addresses:
        if (reason := refusal_reason(ip)) is not None:
            msg = f"refused: {host} resolves to {ip}, which is {reason}"
            raise BlockedAddress(msg)
    return addresses
