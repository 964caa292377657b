"""The NVIDIA container toolkit's settings that decide whether a container's environment can
select GPUs, judged for a node that shares GPUs between tenants who do not trust each other.

Role: ``ToolkitCheck`` reads the toolkit's ``config.toml`` (``tomllib``; default
``/etc/nvidia-container-runtime/config.toml``, the path the toolkit itself reads unless
``NVIDIA_CTK_CONFIG_FILE_PATH`` says otherwise) and ``judge`` gives the verdict the agent
reports on ``/readyz``, in ``koordlet_gpu_isolation`` and in its log.

What the toolkit does (``internal/config/image/cuda_image.go``, ``VisibleDevices``): CDI
annotations first, then (with ``accept-nvidia-visible-devices-as-volume-mounts``) the
``/var/run/nvidia-container-devices/<id>`` mounts of the device plugin's ``volume-mounts``
strategy, then ``NVIDIA_VISIBLE_DEVICES`` (or the ``swarm-resource`` variables, which it
prefers) — the variables only for a privileged container or when
``accept-nvidia-visible-devices-envvar-when-unprivileged`` is true, its default; the same rule
holds for ``NVIDIA_IMEX_CHANNELS``.

Verdicts:

- ``safe``: variables select nothing in an unprivileged container; GPUs reach containers only
  through CDI names and mounts, which a tenant cannot write (the kubelet writes the device
  plugin's, the runtime hook ours with ``--gpu-delivery cdi``).
- ``unsafe``: a variable selects devices in an unprivileged container, so only the runtime
  hook (and the proxy calling it for every container) stands between a container and every
  GPU: a pod the proxy skips, a container created past the proxy, or the proxy's Ignore policy
  while the agent is down sees what its image asks for.
- ``misconfigured``: variables select nothing but the agent delivers GPUs by variable
  (``--gpu-delivery env``): containers of pods koord-scheduler placed get no GPU.
- ``unknown``: no file (the toolkit may read another path, or is absent), an unreadable or
  oversized file, TOML that does not parse, or a key of the wrong type (the toolkit refuses
  such a file too).

Invariants: ``check()`` never raises; it re-reads the file only when its identity (inode,
size, mtime) changed, and logs one line whenever the verdict changes (warning unless safe).
"""

from __future__ import annotations

import os
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import structlog

__all__ = [
    "DEFAULT_TOOLKIT_CONFIG",
    "DELIVERY_CDI",
    "DELIVERY_ENV",
    "MISCONFIGURED",
    "SAFE",
    "STATES",
    "UNKNOWN",
    "UNSAFE",
    "ToolkitCheck",
    "Verdict",
    "judge",
]

DEFAULT_TOOLKIT_CONFIG: Final = "/etc/nvidia-container-runtime/config.toml"
SAFE: Final = "safe"
UNSAFE: Final = "unsafe"
MISCONFIGURED: Final = "misconfigured"
UNKNOWN: Final = "unknown"
STATES: Final = (SAFE, UNSAFE, MISCONFIGURED, UNKNOWN)
DELIVERY_ENV: Final = "env"
DELIVERY_CDI: Final = "cdi"
ENVVAR_KEY: Final = "accept-nvidia-visible-devices-envvar-when-unprivileged"
SWARM_KEY: Final = "swarm-resource"
MAX_CONFIG_BYTES: Final = 1 << 20

log = structlog.get_logger("koordlet.toolkit")


@dataclass(frozen=True, slots=True)
class Verdict:
    state: str
    reasons: tuple[str, ...] = ()

    def line(self) -> str:
        return self.state + (f": {'; '.join(self.reasons)}" if self.reasons else "")


def judge(config: Mapping[str, Any], delivery: str = DELIVERY_ENV) -> Verdict:
    """The verdict for a parsed ``config.toml`` (see the module docstring)."""
    envvar = config.get(ENVVAR_KEY, True)  # the toolkit's default
    swarm = config.get(SWARM_KEY, "")
    if not isinstance(envvar, bool) or not isinstance(swarm, str):
        return Verdict(UNKNOWN, (f"{ENVVAR_KEY} or {SWARM_KEY} has the wrong type",))
    if envvar:
        reasons = [
            f"{ENVVAR_KEY} is true{'' if ENVVAR_KEY in config else ' (the default)'}: "
            "NVIDIA_VISIBLE_DEVICES selects GPUs in unprivileged containers, so only the "
            "runtime hook keeps a container from every GPU"
        ]
        if swarm.strip():
            reasons.append(f"{SWARM_KEY}={swarm!r}: these variables select GPUs ahead of "
                           "NVIDIA_VISIBLE_DEVICES")
        return Verdict(UNSAFE, tuple(reasons))
    if delivery == DELIVERY_ENV:
        return Verdict(MISCONFIGURED, (
            f"{ENVVAR_KEY} is false but the agent hands GPUs out by NVIDIA_VISIBLE_DEVICES "
            "(--gpu-delivery env): containers of pods koord-scheduler placed get no GPU; "
            "use --gpu-delivery cdi",
        ))
    return Verdict(SAFE)


class ToolkitCheck:
    """The verdict for one config file, re-read when it changes; see the module docstring."""

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_TOOLKIT_CONFIG,
                 delivery: str = DELIVERY_ENV) -> None:  # fmt: skip
        self.path = Path(path)
        self.delivery = delivery
        self._lock = threading.Lock()
        self._identity: tuple[int, int, int] | None = None
        self._verdict: Verdict | None = None

    def check(self) -> Verdict:
        with self._lock:
            try:
                st = os.stat(self.path)
                identity: tuple[int, int, int] | None = (st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                identity = None
            if self._verdict is not None and identity is not None and identity == self._identity:
                return self._verdict
            verdict = self._read(identity is not None)
            self._identity = identity
            if verdict != self._verdict:
                (log.info if verdict.state == SAFE else log.warning)(
                    "gpu isolation of this node's container toolkit",
                    path=str(self.path), state=verdict.state, reasons=list(verdict.reasons),
                )
            self._verdict = verdict
            return verdict

    def _read(self, exists: bool) -> Verdict:
        if not exists:
            return Verdict(UNKNOWN, (f"no toolkit config at {self.path}",))
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            return Verdict(UNKNOWN, (f"{self.path}: {exc.strerror or exc}",))
        if len(data) > MAX_CONFIG_BYTES:
            return Verdict(UNKNOWN, (f"{self.path}: larger than {MAX_CONFIG_BYTES} bytes",))
        try:
            config = tomllib.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            return Verdict(UNKNOWN, (f"{self.path}: not TOML: {exc}",))
        except RecursionError:  # tomllib recurses per nested array or inline table
            return Verdict(UNKNOWN, (f"{self.path}: not TOML: nested too deeply",))
        return judge(config, self.delivery)
