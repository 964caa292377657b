"""The chaos tier: two leader-elected ``koord-scheduler run`` replicas, each behind its own
fault proxy, on the real kube-apiserver with an audit log; a seeded schedule of process, API
server and network faults while B1-mix GPU pods arrive, are deleted and are re-created under
the same names. The pods are created by an ordinary user, the GPU pods without a schedulerName:
koord-webhook (``koord-scheduler webhook serve``, registered with the shipped configurations)
gives them the scheduler's (CPU-only pods, which it leaves alone, name it themselves), and is
itself killed, restarted and frozen by the schedule while that user keeps trying to forge
allocations (tests/e2e/chaos/webhook.py). After it settles, from the API objects and the audit
log alone: no card over capacity, every live pod that fits is bound exactly once, no pod lost,
no binding written by a replica that did not hold the lease, every pod carries the scheduler's
name, no forged allocation admitted.

``CHAOS_SEED`` replays a schedule; ``CHAOS_MINUTES`` sets its length (default: bounded, for
``make test``; ``make chaos`` runs a longer one); ``CHAOS_KUBE_VERSION`` picks the control
plane (default: the newest of the e2e matrix; ``1.20`` or ``v1.20.2`` for the oldest). The
figures are printed and written to ``$CHAOS_REPORT`` when set.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.apiserver import NEWEST, resolve_version
from tests.e2e.chaos import audit
from tests.e2e.chaos.faultproxy import FaultProxy
from tests.e2e.chaos.replicas import Replica, Supervisor
from tests.e2e.chaos.webhook import FORGED_PREFIX, ChaosWebhook, Forger
from tests.e2e.chaos.workload import (
    add_node,
    asks_for_gpu,
    b1_limits,
    b1_pod,
    card_usage,
    fits_somewhere,
    node_name,
)
from tests.e2e.chaos.workload import over_committed as find_over_committed
from tests.e2e.test_scheduler_harness import DEVICES, Kube, KubeError, scheduler_config

pytestmark = pytest.mark.e2e

NODES = int(os.environ.get("CHAOS_NODES", "200"))
PODS = int(os.environ.get("CHAOS_PODS", "2000"))
LEASE_S, RENEW_S, RETRY_S = 10, 7, 2
WATCH_STALL_S = 50.0  # > 30 s: well past the old assumed-pod TTL
BURST = 120  # pods created at once before a process fault: binding cycles in flight
RESUME_WINDOW_S = 2.0
"""A late binding received this soon after its replica's SIGCONT was frozen on the wire after
its fence check (``audit.sent_before_freeze``): reported, not a defect of the scheduler."""
GRACE_S = 30.0  # kubelet's default terminationGracePeriodSeconds
# kube-scheduler's client defaults (--kube-api-qps 50, --kube-api-burst 100): a burst of pods
# queues binds behind the client's rate limiter, as on a busy cluster.
REPLICA_ARGS = ("--kube-api-qps=50", "--kube-api-burst=100")
SETTLE_TIMEOUT_S = float(os.environ.get("CHAOS_SETTLE_S", "420"))
NS = "chaos"
SCHEDULER = "koord-chaos"
LEASE = "koord-chaos"
FAULTS = (
    "sigstop_leader",
    "sigkill_any",
    "sigterm_leader",
    "restart_apiserver",
    "stall_watches",
    "recreate_inflight",
    "latency",
    "reset_connections",
    "restart_webhook",
    "stall_webhook",
)
WEBHOOK_STALL_S = 8.0  # > the configurations' timeoutSeconds (5): the API server's calls time out


def _minutes() -> float:
    return float(os.environ.get("CHAOS_MINUTES", "0") or 0)


def retrying(what: str, fn: Callable[[], Any], timeout: float = 180.0) -> Any:
    """Call ``fn`` until it stops failing at the transport or with 5xx (API server restarts)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except KubeError as exc:
            if exc.status < 500 or time.monotonic() > deadline:
                raise
        except Exception as exc:  # urllib3 connection errors while the server restarts
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: {exc}") from exc
        time.sleep(0.5)


class Workload:
    """Creates pods at a steady rate in a thread; ``recreate`` deletes and re-creates pods
    under the same names right after creating them (their binds in flight)."""

    def __init__(
        self, kube: Kube, user: Kube, rng: random.Random, selector: dict[str, str]
    ) -> None:
        self.kube = kube
        self.user = user
        """The ordinary user (``audit.WORKLOAD_USER``) who creates the pods."""
        self.rng = rng
        self.selector = selector
        self.lock = threading.Lock()
        self.live: dict[str, dict[str, str]] = {}  # name -> limits of pods the test keeps
        self.created = 0
        self.deleted = 0
        self.recreated = 0
        self.serial = 0
        self.stop = threading.Event()
        self.errors: list[str] = []

    def _create(self, name: str, limits: dict[str, str]) -> None:
        body = b1_pod(name, SCHEDULER, limits, self.selector)  # GPU pods: no schedulerName

        def post() -> None:
            try:
                self.user.post(f"/api/v1/namespaces/{NS}/pods", body)
            except KubeError as exc:
                if exc.status != 409:  # 409 after a retried create that had landed
                    raise

        retrying(f"create {name}", post)
        with self.lock:
            self.live[name] = limits
            self.created += 1

    def _delete(self, name: str) -> None:
        retrying(f"delete {name}", lambda: self.kube.delete(f"/api/v1/namespaces/{NS}/pods/{name}"))
        with self.lock:
            self.live.pop(name, None)
            self.deleted += 1

    def names(self) -> list[str]:
        with self.lock:
            return sorted(self.live)

    def new_pod(self) -> None:
        with self.lock:
            self.serial += 1
            name = f"p-{self.serial:05d}"
            limits = b1_limits(self.rng)
        self._create(name, limits)

    def arrive(self, rate: float, target: int) -> None:
        """``rate`` pods/s until ``target`` live pods, then churn: one old pod out per new one."""
        period = 1.0 / rate
        next_at = time.monotonic()
        try:
            while not self.stop.is_set():
                next_at += period
                self.stop.wait(max(0.0, next_at - time.monotonic()))
                with self.lock:
                    full = len(self.live) >= target
                    victim = self.rng.choice(sorted(self.live)) if full else None
                if victim:
                    self._delete(victim)
                self.new_pod()
        except Exception as exc:
            self.errors.append(repr(exc))

    def burst(self, count: int) -> None:
        """``count`` new pods at once (8 client threads)."""
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: self.new_pod(), range(count)))

    def recreate(self, count: int) -> str:
        """Create ``count`` pods, then delete and re-create each under the same name while the
        scheduler is binding it (new UID)."""
        with self.lock:
            start = self.serial + 1
            self.serial += count
        names = [f"p-{i:05d}" for i in range(start, start + count)]
        limits = [b1_limits(self.rng) for _ in names]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self._create, names, limits))
        time.sleep(self.rng.uniform(0.05, 0.5))
        for name, lim in zip(names, limits, strict=True):
            self._delete(name)
            self._create(name, lim)
            with self.lock:
                self.recreated += 1
        return f"{count} pods re-created under the same names ({names[0]}..{names[-1]})"


class Chaos:
    """The fault schedule's actions; each returns a line for the fault log."""

    def __init__(
        self,
        srv: Any,
        kube: Kube,
        replicas: list[Replica],
        work: Workload,
        rng: random.Random,
        webhook: ChaosWebhook,
        forger: Forger,
    ) -> None:
        self.webhook = webhook
        self.forger = forger
        self.srv = srv
        self.kube = kube
        self.replicas = replicas
        self.work = work
        self.rng = rng
        self.lease_path = f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{LEASE}"
        self.grace_overruns: list[str] = []
        self.overrun_logs: dict[str, str] = {}  # identity -> its log's tail (thread stacks)

    def holder(self) -> str:
        try:
            return str(self.kube.get(self.lease_path)["spec"].get("holderIdentity") or "")
        except Exception:
            return ""

    def leader(self, timeout: float = 60.0) -> Replica:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            h = self.holder()
            for r in self.replicas:
                if h and h == r.identity and r.running and not r.stopped:
                    return r
            time.sleep(0.5)
        return self.rng.choice(self.replicas)  # nobody leads: fault a random one

    def sigstop_leader(self) -> str:
        r = self.leader()
        before = r.identity
        self.work.burst(BURST)
        time.sleep(self.rng.uniform(0.2, 1.5))
        r.signal(signal.SIGSTOP)
        time.sleep(LEASE_S + 1)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.holder() in ("", before):
            time.sleep(0.1)  # wake it the moment the standby takes over: its queue is fullest
        taken = self.holder()
        r.signal(signal.SIGCONT)
        return f"SIGSTOP {before} for >{LEASE_S}s (lease then held by {taken!r}), SIGCONT"

    def sigkill_any(self) -> str:
        r = self.rng.choice(self.replicas)
        ident = r.identity
        r.signal(signal.SIGKILL)
        return f"SIGKILL {ident}"

    def sigterm_leader(self) -> str:
        r = self.leader()
        ident = r.identity
        self.work.burst(BURST)
        time.sleep(self.rng.uniform(0.2, 1.5))
        proc = r.proc
        r.signal(signal.SIGTERM)
        threading.Thread(target=self._kill_after_grace, args=(r, proc, ident), daemon=True).start()
        return f"SIGTERM {ident} (graceful hand-over)"

    def _kill_after_grace(self, r: Replica, proc: Any, ident: str) -> None:
        """kubelet's terminationGracePeriodSeconds: SIGKILL a process that did not exit."""
        if proc is None or proc.proc is None:
            return
        try:
            proc.proc.wait(GRACE_S)
        except subprocess.TimeoutExpired:
            self.grace_overruns.append(ident)
            with r.lock:
                if r.proc is proc:
                    # SIGABRT first: faulthandler writes every thread's stack to its log (the
                    # evidence of where the stop hung), then SIGKILL as kubelet would.
                    r.signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.proc.wait(2)
            with r.lock:
                if r.proc is proc:
                    r.signal(signal.SIGKILL)
            self.overrun_logs[ident] = proc.log_tail(120)

    def restart_apiserver(self) -> str:
        t0 = time.monotonic()
        self.srv.restart_apiserver()
        return f"API server restarted ({time.monotonic() - t0:.1f}s down)"

    def stall_watches(self) -> str:
        r = self.leader()
        r.proxy.stall(WATCH_STALL_S, "long")
        self.work.burst(BURST)  # bound now, confirmed by the watch only after the stall
        time.sleep(WATCH_STALL_S - 15)
        self.work.burst(BURST)  # placed while the first burst's events are > 30 s late
        time.sleep(r.proxy.stall_remaining)
        return f"watches of {r.identity} stalled {WATCH_STALL_S:.0f}s (binds flowing)"

    def recreate_inflight(self) -> str:
        r = self.leader()
        r.proxy.set_latency(0.3)  # widen the bind's in-flight window
        try:
            return self.work.recreate(self.rng.randint(10, 30)) + f" (leader {r.identity})"
        finally:
            r.proxy.set_latency(0.0)

    def latency(self) -> str:
        r = self.rng.choice(self.replicas)
        lat = self.rng.uniform(0.2, 1.0)
        r.proxy.set_latency(lat)
        time.sleep(10)
        r.proxy.set_latency(0.0)
        return f"{lat:.2f}s latency on {r.identity}'s connections for 10s"

    def reset_connections(self) -> str:
        r = self.rng.choice(self.replicas)
        n = r.proxy.reset("all")
        return f"reset {n} connections of {r.identity}"

    def restart_webhook(self) -> str:
        """SIGKILL the webhook; pod creates fail (mutate and guard fail closed) and are retried,
        forgeries are tried while it is down; then it starts again."""
        self.webhook.kill()
        self.webhook.outages += 1
        down = self.rng.uniform(2, 6)
        self.forger.during(down, self.work.names)
        self.webhook.start()
        return f"webhook SIGKILLed, restarted after {down:.1f}s (forgeries tried meanwhile)"

    def stall_webhook(self) -> str:
        """SIGSTOP the webhook past the configurations' timeoutSeconds: the API server's calls
        time out (failurePolicy decides), forgeries are tried; then SIGCONT."""
        self.webhook.signal(signal.SIGSTOP)
        self.webhook.outages += 1
        self.forger.during(WEBHOOK_STALL_S, self.work.names)
        self.webhook.signal(signal.SIGCONT)
        return f"webhook SIGSTOPped {WEBHOOK_STALL_S:.0f}s (forgeries tried meanwhile)"


def schedule(rng: random.Random, minutes: float) -> list[str]:
    """Every kind once (shuffled), then more at random until the time budget is spent.
    ``CHAOS_FAULTS=a,b`` narrows the kinds (to chase one failure)."""
    only = [k for k in os.environ.get("CHAOS_FAULTS", "").split(",") if k]
    unknown = set(only) - set(FAULTS)
    if unknown:
        raise ValueError(f"CHAOS_FAULTS: unknown kinds {sorted(unknown)}; known: {FAULTS}")
    kinds = only or list(FAULTS)
    rng.shuffle(kinds)
    if minutes <= 0:
        return kinds
    cost = {
        "sigstop_leader": 30,
        "stall_watches": 55,
        "restart_apiserver": 20,
        "recreate_inflight": 10,
        "latency": 15,
        "restart_webhook": 10,
        "stall_webhook": 12,
    }
    budget = minutes * 60 - sum(cost.get(k, 5) + 8 for k in kinds)
    while budget > 0:
        k = rng.choice(only or FAULTS)
        kinds.append(k)
        budget -= cost.get(k, 5) + 8
    return kinds


def _chaos_version() -> str:
    """The control plane the chaos run uses: env ``CHAOS_KUBE_VERSION``, else the newest."""
    want = os.environ.get("CHAOS_KUBE_VERSION", "").strip()
    if not want:
        return NEWEST
    try:
        return resolve_version(want)
    except ValueError as exc:
        raise pytest.UsageError(f"CHAOS_KUBE_VERSION: {exc}") from None


@pytest.fixture
def chaos_apiserver(make_apiserver: Callable[..., Any]) -> Any:
    users = {f"koord-chaos-{n}": ["system:masters"] for n in ("replica-a", "replica-b")}
    users[audit.WORKLOAD_USER] = ["chaos-users"]
    return make_apiserver(audit_policy=audit.AUDIT_POLICY, extra_users=users)


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Iterator[Callable[[str], None]]:
    capman = request.config.pluginmanager.getplugin("capturemanager")
    lines: list[str] = []

    def say(line: str) -> None:
        lines.append(line)
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            print(f"[chaos] {line}", flush=True)

    yield say


def _card_key(card: str) -> tuple[str, int]:
    node, _, minor = card.rpartition("/")
    return node, int(minor)


# One control plane per run (the newest by default), not the whole matrix: the bounded run is
# minutes long.
@pytest.mark.parametrize(
    "kube_version", [_chaos_version()], indirect=True, ids=lambda v: f"k8s-{v}"
)
def test_chaos(chaos_apiserver: Any, tmp_path: Path, report: Callable[[str], None]) -> None:
    srv = chaos_apiserver
    seed = int(os.environ.get("CHAOS_SEED") or random.SystemRandom().randrange(1 << 31))
    minutes = _minutes()
    report(
        f"seed {seed} (replay: CHAOS_SEED={seed}); minutes {minutes or 'bounded'}; "
        f"{NODES} nodes x 8 GPUs, {PODS} pods"
    )
    rng = random.Random(seed)
    kube = Kube(srv.url, srv.admin_token)
    kube.ensure_namespace(NS)
    kube.ensure_device_crd()
    selector = {"chaos": "yes"}
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: add_node(kube, "chaos", i, selector), range(NODES)))
    report(f"cluster made in {time.monotonic() - t0:.0f}s")

    cfg = scheduler_config(
        tmp_path / "config.yaml",
        SCHEDULER,
        lease=LEASE,
        durations=(f"{LEASE_S}s", f"{RENEW_S}s", f"{RETRY_S}s"),
    )
    replicas = []
    for name in ("replica-a", "replica-b"):
        user = f"koord-chaos-{name}"
        proxy = FaultProxy("127.0.0.1", srv.port).start()
        kubeconfig = srv.kubeconfig_path(srv.token_for(user), server=proxy.url)
        replicas.append(Replica(name, user, kubeconfig, cfg, tmp_path, proxy, REPLICA_ARGS))
    webhook = ChaosWebhook(tmp_path, SCHEDULER, [r.user for r in replicas]).start()
    workload_user = Kube(srv.url, srv.token_for(audit.WORKLOAD_USER))
    webhook.register(kube, workload_user, NS)
    forger = Forger(workload_user, NS, [node_name("chaos", i) for i in range(NODES)], rng)
    supervisor = Supervisor(replicas).start()
    work = Workload(kube, workload_user, rng, selector)
    chaos = Chaos(srv, kube, replicas, work, rng, webhook, forger)
    faults: list[str] = []
    arrival: threading.Thread | None = None
    try:
        chaos.leader(timeout=120)
        kinds = schedule(rng, minutes)
        span = max(150.0, minutes * 60)
        rate = PODS / (0.7 * min(span, 180.0))
        arrival = threading.Thread(target=work.arrive, args=(rate, PODS), daemon=True)
        arrival.start()
        start = time.monotonic()
        for kind in kinds:
            time.sleep(rng.uniform(3, 8))
            line = getattr(chaos, kind)()
            faults.append(f"{time.monotonic() - start:7.1f}s {kind}: {line}")
            report(faults[-1])
            forger.attempt(work.names())
        while work.created < PODS and not work.errors:  # the bounded run: all pods arrive
            time.sleep(1)
        work.stop.set()
        arrival.join(60)
        assert not work.errors, work.errors

        # Settle: faults off, everyone running; wait until no pending pod fits anywhere.
        for r in replicas:
            r.proxy.unstall()
            r.proxy.set_latency(0.0)
            r.signal(signal.SIGCONT)
        webhook.signal(signal.SIGCONT)
        if not webhook.running():
            webhook.start()
        settle_start = time.monotonic()
        stuck: list[str] = []
        while time.monotonic() - settle_start < SETTLE_TIMEOUT_S:
            pods = retrying("list pods", lambda: kube.pods(NS))
            devices = retrying("list devices", lambda: kube.get(DEVICES)["items"])
            cards = card_usage(devices, pods)
            stuck = [
                p["metadata"]["name"]
                for p in pods
                if not p["spec"].get("nodeName") and fits_somewhere(p, cards)
            ]
            if not stuck:
                break
            time.sleep(3)
        settle_s = time.monotonic() - settle_start

        # -- checks from API objects ------------------------------------------------------
        pods = kube.pods(NS)
        devices = kube.get(DEVICES)["items"]
        cards = card_usage(devices, pods)
        over = find_over_committed(cards)
        by_name = {p["metadata"]["name"]: p for p in pods}
        lost = sorted(set(work.live) - set(by_name))
        bound = [p for p in pods if p["spec"].get("nodeName")]
        pending = [p for p in pods if not p["spec"].get("nodeName")]
        unnamed = sorted(
            p["metadata"]["name"] for p in pods if p["spec"].get("schedulerName") != SCHEDULER
        )
        named_by_webhook = sum(
            1 for p in pods
            if p["spec"].get("schedulerName") == SCHEDULER
            and asks_for_gpu(p["spec"]["containers"][0]["resources"].get("limits", {}))
        )  # fmt: skip

        # -- checks from the audit log ----------------------------------------------------
        events = srv.audit_events()
        user_writes = audit.pod_writes(events, NS, audit.WORKLOAD_USER)
        forged = sorted(
            {f"{w.verb} {w.name}/{w.subresource} ({w.code})" for w in user_writes
             if w.code < 300
             and (w.verb in ("patch", "update") or w.subresource == "binding"
                  or w.name.startswith(FORGED_PREFIX))}
            | set(forger.admitted)
            | {f"live {p['metadata']['name']}" for p in pods
               if p["metadata"]["name"].startswith(FORGED_PREFIX)}
        )  # fmt: skip
        leases = audit.lease_writes(events, "default", LEASE)
        bindings = audit.binding_writes(events, NS)
        users = {r.user: r.identity_prefix for r in replicas}
        late_all = audit.late_binds(bindings, leases, users)
        late_attempts = audit.late_binds(bindings, leases, users, attempts=True)
        late, frozen = audit.sent_before_freeze(
            late_all, {r.user: r.resumes for r in replicas}, RESUME_WINDOW_S
        )
        landed = audit.bindings_of_live(bindings, audit.last_creates(events, NS))
        not_once = {
            p["metadata"]["name"]: len(landed.get(p["metadata"]["name"], []))
            for p in bound
            if len(landed.get(p["metadata"]["name"], [])) != 1
        }
        stale_uid = [
            b
            for p in bound
            for b in landed.get(p["metadata"]["name"], [])
            if b.uid != p["metadata"]["uid"]
        ]
        # Over-committed cards that hold a pod a stale-UID binding landed on (the v1.20 API server
        # binds by name): counted apart to show the cause, and still failures.
        stale_names = {b.name for b in stale_uid}
        over_stale = {
            card: use
            for card, use in over.items()
            if any(name in stale_names for name in cards[_card_key(card)].pods)
        }
        # An API server killed mid-request can commit a binding without writing its audit event:
        # reported apart (a pod bound more than once still fails).
        restarted = any(" restart_apiserver:" in f for f in faults)
        unaudited = {n: c for n, c in not_once.items() if c == 0 and restarted}
        not_once = {n: c for n, c in not_once.items() if n not in unaudited}
        exits = [f"{e.identity}:{e.code}" for r in replicas for e in r.exits]
        figures = {
            "seed": seed,
            "minutes": minutes,
            "nodes": NODES,
            "faults_injected": len(faults),
            "faults_by_kind": dict(Counter(f.split()[1].rstrip(":") for f in faults)),
            "pods_created": work.created,
            "pods_deleted": work.deleted,
            "pods_recreated_same_name": work.recreated,
            "pods_live": len(pods),
            "pods_bound": len(bound),
            "pods_pending_not_fitting": len(pending) - len(stuck),
            "pods_pending_fitting": len(stuck),
            "pods_lost": len(lost),
            "over_committed_cards": len(over),
            "over_committed_by_stale_uid_bindings": len(over_stale),
            "late_binds": len(late),
            "late_binds_in_flight_at_freeze": len(frozen),
            "late_bind_attempts_rejected": len(late_attempts) - len(late_all),
            "bound_not_exactly_once": len(not_once),
            "bound_without_audit_record_across_restart": len(unaudited),
            "binding_writes": len(bindings),
            "binding_writes_ok": sum(b.code == 201 for b in bindings),
            "stale_uid_bindings_landed": len(stale_uid),
            "lease_transitions": len(audit.transitions(leases)),
            "replica_exits": len(exits),
            "sigterm_exits_over_grace_period": len(chaos.grace_overruns),
            "replica_restarts": supervisor.restarts,
            "settle_seconds": round(settle_s, 1),
            "webhook_starts": webhook.starts,
            "webhook_outages": webhook.outages,
            "pods_without_scheduler_name": len(unnamed),
            "gpu_pods_named_by_webhook": named_by_webhook,
            "forgeries_attempted": sum(forger.answers.values()),
            "forgeries_answered": {str(k): v for k, v in sorted(forger.answers.items())},
            "forgeries_admitted": len(forged),
        }
        report("figures " + json.dumps(figures))
        if os.environ.get("CHAOS_REPORT"):
            Path(os.environ["CHAOS_REPORT"]).write_text(
                json.dumps({**figures, "faults": faults, "exits": exits}, indent=2)
            )
        problems = []
        if over:
            problems.append(f"over-committed cards: {dict(list(over.items())[:10])}")
        if late:
            problems.append("late binds:\n  " + "\n  ".join(map(str, late[:20])))
        if lost:
            problems.append(f"pods lost: {lost[:20]}")
        if stuck:
            problems.append(f"pending pods that fit: {stuck[:20]}")
        if chaos.grace_overruns:
            problems.append(
                f"did not exit within {GRACE_S:.0f}s of SIGTERM (SIGKILLed, as kubelet would): "
                f"{chaos.grace_overruns}"
                + "".join(
                    f"\n--- {ident}: the end of its log (SIGABRT: every thread's stack) ---\n{tail}"
                    for ident, tail in chaos.overrun_logs.items()
                )
            )
        if unnamed:
            problems.append(f"pods admitted without the scheduler's name: {unnamed[:20]}")
        if not named_by_webhook:
            problems.append("no GPU pod was given the scheduler's name (the webhook never ran?)")
        if forged:
            problems.append(f"forged allocations admitted: {forged[:20]}")
        if not forger.answers.get(403):
            problems.append(f"no forgery met the guard (answers {dict(forger.answers)})")
        if not_once:
            problems.append(
                f"bound pods without exactly one binding: {dict(list(not_once.items())[:20])}"
            )
        assert not problems, (
            f"seed {seed}:\n" + "\n".join(problems) + "\nfaults:\n" + "\n".join(faults)
        )
        assert bound, "nothing was bound"
    finally:
        with contextlib.suppress(OSError):  # the server's dir goes with it: keep the evidence
            shutil.copy(srv.audit_log, tmp_path / "audit.log")
        report(f"logs: {tmp_path} (audit.log, one log per replica incarnation)")
        work.stop.set()
        if arrival is not None:
            arrival.join(60)
        supervisor.stop()
        webhook.stop()
        for r in replicas:
            r.proxy.stop()
