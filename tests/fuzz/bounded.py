"""One fuzz input run in a forked child with a time and a memory bound.

Role: the short pass (``test_fuzz.py``) holds every target to "bounded time and memory": the
child gets an address-space limit (``RLIMIT_AS``) of what it already maps plus
``memory_bytes``, and is killed after ``seconds``. The outcome says how the input ended:
``ok`` (decoded), ``refused`` (the declared error), ``crash`` (any other exception, with its
traceback), ``memory`` (MemoryError under the limit), ``timeout`` or ``died`` (a signal).

Invariant: the parent never runs the input itself, so a hang or a blow-up ends only the child.
"""

from __future__ import annotations

import os
import pickle
import resource
import select
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import structlog

__all__ = ["Outcome", "run_bounded"]


@dataclass(frozen=True)
class Outcome:
    kind: str
    detail: str = ""
    seconds: float = 0.0


def _mapped_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def _child(
    run: Callable[[bytes], object],
    errors: tuple[type[BaseException], ...],
    data: bytes,
    memory_bytes: int,
) -> Outcome:
    # The decoders' log lines are not the outcome, and the parent's other threads may have
    # held sys.stdout's lock when it forked: log nowhere, write nothing through Python's I/O.
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    limit = _mapped_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    start = time.perf_counter()
    try:
        run(data)
        kind, detail = "ok", ""
    except MemoryError:
        kind, detail = "memory", "MemoryError"
    except BaseException as exc:
        if errors and isinstance(exc, errors):
            kind, detail = "refused", str(exc)[:300]
        else:
            kind = "crash"
            detail = "".join(traceback.format_exception(exc)[-12:])
    return Outcome(kind, detail, time.perf_counter() - start)


def run_bounded(
    run: Callable[[bytes], object],
    errors: tuple[type[BaseException], ...],
    data: bytes,
    *,
    seconds: float,
    memory_bytes: int,
) -> Outcome:
    """Run ``run(data)`` in a child; see the module docstring."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's frames
        os.close(read_fd)
        code = 0
        try:
            outcome = _child(run, errors, data, memory_bytes)
            payload = pickle.dumps(outcome)
            with os.fdopen(write_fd, "wb") as w:
                w.write(payload)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    timed_out = False
    with os.fdopen(read_fd, "rb") as r:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([r], [], [], left)
            if not ready:
                continue
            chunk = os.read(r.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if timed_out:
        return Outcome("timeout", f"still running after {seconds} s", seconds)
    if chunks:
        outcome: Outcome = pickle.loads(b"".join(chunks))
        return outcome
    if os.WIFSIGNALED(status):
        return Outcome("died", f"killed by signal {os.WTERMSIG(status)}")
    return Outcome("died", f"exited {os.WEXITSTATUS(status)} without an outcome")
