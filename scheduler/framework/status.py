"""The one result type of every extension point: ``Status``.

A plugin returns ``None`` (success) or a ``Status``. The runtime stamps the failing plugin's name
on the status and turns a plugin exception into an ``ERROR`` status, so plugins never need to
know their own name or catch their own bugs.

Invariants: a status is immutable; ``reasons`` are the user-facing texts that end up, counted,
in the FitError message; ``SUCCESS`` is represented by ``None`` on the hot path.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Code(IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    WAIT = 4
    SKIP = 5

    @property
    def label(self) -> str:
        """The CamelCase name kube-scheduler uses (metrics labels, logs)."""
        return _LABELS[self]


_LABELS = {
    Code.SUCCESS: "Success",
    Code.ERROR: "Error",
    Code.UNSCHEDULABLE: "Unschedulable",
    Code.UNSCHEDULABLE_AND_UNRESOLVABLE: "UnschedulableAndUnresolvable",
    Code.WAIT: "Wait",
    Code.SKIP: "Skip",
}


@dataclass(frozen=True, slots=True)
class Status:
    code: Code
    reasons: tuple[str, ...] = ()
    error: BaseException | None = None
    plugin: str = ""

    @property
    def is_success(self) -> bool:
        return self.code == Code.SUCCESS

    @property
    def is_skip(self) -> bool:
        return self.code == Code.SKIP

    @property
    def is_rejected(self) -> bool:
        """Unschedulable or UnschedulableAndUnresolvable: a verdict, not a failure."""
        return self.code in (Code.UNSCHEDULABLE, Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    @property
    def message(self) -> str:
        if self.reasons:
            return ", ".join(self.reasons)
        return str(self.error) if self.error is not None else ""

    def with_plugin(self, plugin: str) -> Status:
        if self.plugin == plugin:
            return self
        return Status(self.code, self.reasons, self.error, plugin)  # replace(), minus its cost

    def __str__(self) -> str:
        who = f"{self.plugin}: " if self.plugin else ""
        return f"{self.code.label}: {who}{self.message}"


def unschedulable(*reasons: str) -> Status:
    return Status(Code.UNSCHEDULABLE, reasons)


def unresolvable(*reasons: str) -> Status:
    return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, reasons)


def error(err: BaseException | str) -> Status:
    exc = err if isinstance(err, BaseException) else RuntimeError(err)
    return Status(Code.ERROR, (), exc)


SKIP = Status(Code.SKIP)
WAIT = Status(Code.WAIT)


def is_success(status: Status | None) -> bool:
    return status is None or status.code == Code.SUCCESS
