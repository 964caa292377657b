"""Loopback ports for the servers the tests start: ``free_port()``.

A port is picked now and bound later by another process (kube-apiserver, etcd, Prometheus,
an agent), so it can be taken in between. The kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default) is where every outgoing
connection of the machine takes its local port — and where ``bind(0)`` picks too — so a port
picked there collides with the next outgoing connection often enough to turn a full run red.
Ports are picked below that range, at random, never twice in one process, and checked free.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

__all__ = ["free_port"]

_LOW = 10000
_handed_out: set[int] = set()
_lock = threading.Lock()
_rng = random.SystemRandom()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback TCP port that is free now, outside the ephemeral range, not handed out
    before by this process."""
    high = _ephemeral_low()
    with _lock:
        if high - _LOW > 1000:
            for _ in range(200):
                port = _rng.randrange(_LOW, high)
                if port not in _handed_out and _bindable(port):
                    _handed_out.add(port)
                    return port
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # no room below: the kernel's
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        _handed_out.add(port)
        return port
