"""The network interface gloo binds to, named when the main address is not loopback.

gloo otherwise binds to the address the host name resolves to, often ``127.0.0.1``, and a
multi-node job hangs at the rendezvous until a timeout. NCCL, HCCL and oneCCL pick a
non-loopback interface by themselves (the docs' troubleshooting section lists their variables).

Example:
    >>> is_loopback("127.0.0.1"), is_loopback("localhost")
    (True, True)
    >>> configure_socket_interface("127.0.0.1", {}) is None  # loopback: nothing to name
    True
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket

import psutil

log = logging.getLogger(__name__)

#: The interface variable gloo reads. NCCL, HCCL and oneCCL pick a non-loopback interface by
#: themselves; their variables are listed in the docs' troubleshooting section.
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP or host name) resolves to a loopback address.

    >>> is_loopback("127.0.0.1"), is_loopback("localhost")
    (True, True)
    """
    try:
        return ipaddress.ip_address(socket.gethostbyname(address)).is_loopback
    except (OSError, ValueError):
        return False


def interface_towards(address: str) -> str | None:
    """The name of the local interface the kernel would use to reach ``address``.

    A UDP ``connect`` only consults the routing table (no packet is sent); the local address
    it picks is then looked up among the interfaces.
    """
    try:
        target = socket.gethostbyname(address)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((target, 9))
            local = probe.getsockname()[0]
    except OSError:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(item.family == socket.AF_INET and item.address == local for item in addresses):
            return name
    return None


def configure_socket_interface(main_address: str, environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """Set ``GLOO_SOCKET_IFNAME`` to the interface that reaches ``main_address``, unless set already.

    Returns the interface chosen (``None`` when nothing was changed: variable already set,
    loopback main address, or no interface found).
    """
    if environ.get(GLOO_SOCKET_IFNAME) or is_loopback(main_address):
        return None
    name = interface_towards(main_address)
    if name is None:
        log.warning(
            "Could not find the interface that reaches MASTER_ADDR=%s; if the job hangs at the rendezvous,"
            " set %s to it.", main_address, GLOO_SOCKET_IFNAME,
        )
        return None
    environ[GLOO_SOCKET_IFNAME] = name
    log.info("Using network interface %s (towards MASTER_ADDR=%s) for gloo.", name, main_address)
    return name


__all__ = ["GLOO_SOCKET_IFNAME", "configure_socket_interface", "interface_towards", "is_loopback"]
