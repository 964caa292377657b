"""koordlet.devices.health: XID rules, the health tracker, probes and the watcher thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from koordlet.devices.fake import FakeLibrary, parse_fake_spec
from koordlet.devices.health import (
    APPLICATION_XIDS,
    HealthTracker,
    HealthWatcher,
    probe_all,
    xid_health,
)
from koordlet.devices.library import (
    GPU,
    HEALTHY,
    Discovery,
    GPUUsage,
    Health,
    HealthEvent,
    query_failed,
)

XID79 = Health(False, "Xid79", "Xid error detected on device, error code: 79")
LOST = query_failed("NVML query", "GPU is lost")


def _wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.mark.parametrize(
    ("xid", "expected"),
    [
        *(pytest.param(x, None, id=f"application-{x}") for x in (13, 31, 43, 45, 68, 109)),
        pytest.param(79, XID79, id="fallen-off-the-bus"),
        pytest.param(
            48,
            Health(False, "Xid48", "Xid error detected on device, error code: 48"),
            id="double-bit-ecc",
        ),
        pytest.param(
            94,
            Health(False, "Xid94", "Xid error detected on device, error code: 94"),
            id="contained-ecc",
        ),
    ],
)
def test_xid_health(xid: int, expected: Health | None) -> None:
    assert xid_health(xid) == expected


def test_application_xids_are_the_device_plugins() -> None:
    assert frozenset({13, 31, 43, 45, 68, 109}) == APPLICATION_XIDS


# -- tracker ----------------------------------------------------------------------------------


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def test_tracker_starts_healthy_except_initial_findings() -> None:
    tracker = HealthTracker(["a", "b"], {"b": LOST, "zzz": LOST})
    assert tracker.snapshot() == {"a": HEALTHY, "b": LOST}
    assert tracker.get("zzz") is None


@pytest.mark.parametrize(
    ("event", "expected", "changed"),
    [
        pytest.param(HealthEvent("a", XID79), {"a": XID79, "b": HEALTHY}, True, id="one-card"),
        pytest.param(HealthEvent("", XID79), {"a": XID79, "b": XID79}, True, id="every-card"),
        pytest.param(
            HealthEvent("a", HEALTHY), {"a": HEALTHY, "b": HEALTHY}, False, id="no-change"
        ),
        pytest.param(
            HealthEvent("x", XID79), {"a": HEALTHY, "b": HEALTHY}, False, id="unknown-card"
        ),
    ],
)
def test_tracker_apply(event: HealthEvent, expected: dict[str, Health], changed: bool) -> None:
    calls = Counter()
    tracker = HealthTracker(["a", "b"], on_change=calls)
    assert tracker.apply(event) is changed
    assert tracker.snapshot() == expected
    assert calls.calls == int(changed)


@pytest.mark.parametrize(
    ("current", "probe", "after", "changed"),
    [
        pytest.param(HEALTHY, LOST, LOST, True, id="healthy-then-lost"),
        pytest.param(LOST, HEALTHY, HEALTHY, True, id="lost-then-back"),
        pytest.param(XID79, HEALTHY, XID79, False, id="xid-is-sticky"),
        pytest.param(XID79, LOST, XID79, False, id="xid-reason-kept"),
        pytest.param(HEALTHY, HEALTHY, HEALTHY, False, id="still-healthy"),
        pytest.param(LOST, LOST, LOST, False, id="still-lost"),
    ],
)
def test_tracker_apply_probe(current: Health, probe: Health, after: Health, changed: bool) -> None:
    calls = Counter()
    tracker = HealthTracker(["a"], {"a": current}, on_change=calls)
    assert tracker.apply_probe("a", probe) is changed
    assert tracker.get("a") == after
    assert calls.calls == int(changed)
    assert tracker.apply_probe("unknown", LOST) is False


def test_probe_all_uses_the_library(tmp_path: Path) -> None:
    spec = parse_fake_spec(
        {
            "healthFile": "h.yaml",
            "gpus": [{"uuid": "GPU-0", "minor": 0}, {"uuid": "GPU-1", "minor": 1}],
        },
        tmp_path,
    )
    lib = FakeLibrary(spec)
    gpus = lib.discover().gpus
    tracker = HealthTracker(g.uuid for g in gpus)
    assert probe_all(lib, gpus, tracker) is False
    (tmp_path / "h.yaml").write_text(yaml.safe_dump({"GPU-1": {"healthy": True, "lost": True}}))
    assert probe_all(lib, gpus, tracker) is True
    assert tracker.snapshot() == {"GPU-0": HEALTHY, "GPU-1": LOST}
    (tmp_path / "h.yaml").unlink()
    assert probe_all(lib, gpus, tracker) is True
    assert tracker.get("GPU-1") == HEALTHY


# -- watcher ----------------------------------------------------------------------------------


@pytest.fixture
def fake(tmp_path: Path) -> FakeLibrary:
    spec = parse_fake_spec(
        {
            "healthFile": "h.yaml",
            "gpus": [{"uuid": "GPU-0", "minor": 0}, {"uuid": "GPU-1", "minor": 1}],
        },
        tmp_path,
    )
    return FakeLibrary(spec, poll_interval_s=0.01)


def test_watcher_feeds_events_into_the_tracker(fake: FakeLibrary, tmp_path: Path) -> None:
    gpus = fake.discover().gpus
    changed = threading.Event()
    tracker = HealthTracker((g.uuid for g in gpus), on_change=changed.set)
    watcher = HealthWatcher(fake, tracker, gpus, wait_timeout_s=0.05)
    assert watcher.start() and watcher.running
    (tmp_path / "h.yaml").write_text(yaml.safe_dump({"GPU-1": {"reason": "Xid79"}}))
    assert changed.wait(5.0)
    assert tracker.get("GPU-1") == Health(False, "Xid79", "marked unhealthy in the health file")
    watcher.stop()
    assert not watcher.running
    watcher.stop()  # idempotent


def test_watcher_without_cards_or_support_starts_no_thread(fake: FakeLibrary) -> None:
    tracker = HealthTracker(())
    assert HealthWatcher(fake, tracker, ()).start() is False


class ScriptedLibrary:
    """A DeviceLibrary whose health events come from a script (raise, events, then None)."""

    def __init__(self, script: list[object], supported: bool = True) -> None:
        self.script = script
        self.supported = supported
        self.closed = 0

    def init(self) -> bool:
        return True

    def shutdown(self) -> None:
        pass

    def discover(self) -> Discovery:
        return Discovery()

    def probe(self, gpu: GPU) -> Health:
        return HEALTHY

    def usage(self, gpu: GPU) -> GPUUsage:
        return GPUUsage(0, None)

    def open_health_events(self, gpus: tuple[GPU, ...]) -> bool:
        return self.supported

    def wait_health_event(self, timeout_s: float) -> HealthEvent | None:
        if not self.script:
            time.sleep(min(timeout_s, 0.01))
            return None
        item = self.script.pop(0)
        if isinstance(item, Exception):
            raise item
        assert item is None or isinstance(item, HealthEvent)
        return item

    def close_health_events(self) -> None:
        self.closed += 1


GPUS = (GPU(uuid="a", minor=0), GPU(uuid="b", minor=1))


def test_watcher_survives_a_library_error() -> None:
    lib = ScriptedLibrary([RuntimeError("boom"), HealthEvent("b", XID79)])
    tracker = HealthTracker(["a", "b"])
    watcher = HealthWatcher(lib, tracker, GPUS, wait_timeout_s=0.01, error_backoff_s=0.01)
    assert watcher.start()
    _wait_for(lambda: tracker.get("b") == XID79)
    watcher.stop()
    assert lib.closed == 1


def test_watcher_backs_off_after_a_whole_library_event() -> None:
    lib = ScriptedLibrary([HealthEvent("", XID79), HealthEvent("a", HEALTHY)])
    tracker = HealthTracker(["a", "b"])
    watcher = HealthWatcher(lib, tracker, GPUS, wait_timeout_s=0.01, error_backoff_s=30.0)
    assert watcher.start()
    _wait_for(lambda: tracker.get("b") == XID79)
    started = time.monotonic()
    watcher.stop()  # interrupts the back-off at once
    assert time.monotonic() - started < 5.0
    assert tracker.get("a") == XID79  # the second event never ran: still backing off


def test_watcher_unsupported_events() -> None:
    lib = ScriptedLibrary([], supported=False)
    watcher = HealthWatcher(lib, HealthTracker(["a"]), GPUS)
    assert watcher.start() is False
    assert not watcher.running
    watcher.stop()
    assert lib.closed == 0


def test_watcher_cannot_start_twice() -> None:
    watcher = HealthWatcher(ScriptedLibrary([]), HealthTracker(["a"]), GPUS, wait_timeout_s=0.01)
    assert watcher.start()
    with pytest.raises(RuntimeError):
        watcher.start()
    watcher.stop()
