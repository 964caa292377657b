"""The admission webhook's routes and metrics: ``POST /mutate``, ``/validate``, ``/guard``.

Role: ``AdmissionRoutes`` turns a request body into an ``AdmissionReview`` answer with the
pure deciders (``mutate``, ``validate.pod_problem``, ``guard.guard_problem``), counts every
answer in ``WebhookMetrics``, and tracks the requests in flight so a stopping server can
drain them. The HTTPS serving (TLS, bounded bodies, backlog, /healthz, /metrics) is the
shared ``scheduler.observability.health.HealthServer``, given these routes.

Answers: a review it can decode is always answered 200 with the verdict in the body (as the
API server expects); a body that is not a review is 400 with one line (``ReviewError``).
``/validate`` judges pod CREATEs (failurePolicy Ignore in the shipped configuration), ``/guard``
pod CREATEs and UPDATEs of allocation annotations (failurePolicy Fail).

Metrics (own registry): ``koord_webhook_requests_total`` and
``koord_webhook_request_duration_seconds`` by ``webhook`` (mutate, validate, guard),
``operation`` (CREATE, UPDATE, ..., ``unknown`` for an undecodable body) and ``verdict``
(allowed, patched, denied, invalid).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import BinaryIO, Final

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector

from scheduler.observability.metrics import plain_exposition
from scheduler.webhook.guard import guard_problem
from scheduler.webhook.mutate import mutate
from scheduler.webhook.policy import WebhookPolicy
from scheduler.webhook.review import Review, ReviewError, decode_review, encode_response
from scheduler.webhook.validate import pod_problem

__all__ = ["LATENCY_BUCKETS", "ROUTES", "AdmissionRoutes", "WebhookMetrics"]

log = structlog.get_logger("koord-webhook")
JSON: Final = "application/json"
LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ROUTES: Final = ("/mutate", "/validate", "/guard")
Answer = tuple[int, bytes, str]


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry(auto_describe=True)
        labels = ("webhook", "operation", "verdict")
        self._count = Counter(
            "koord_webhook_requests",
            "Admission requests answered, by webhook, operation and verdict.",
            labels,
            registry=self.registry,
        )
        self._latency = Histogram(
            "koord_webhook_request_duration_seconds",
            "Time to answer an admission request (decode, decide, encode).",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )

    def watch_process(self) -> None:
        ProcessCollector(registry=self.registry)

    def observe(self, webhook: str, operation: str, verdict: str, seconds: float) -> None:
        self._count.labels(webhook, operation, verdict).inc()
        self._latency.labels(webhook, operation, verdict).observe(seconds)

    def write(self, out: BinaryIO) -> None:
        out.write(plain_exposition(self.registry))


class AdmissionRoutes:
    """The three webhooks over one policy; see the module docstring."""

    def __init__(
        self,
        policy: WebhookPolicy,
        metrics: WebhookMetrics,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self._clock = clock
        self._busy = 0
        self._idle = threading.Condition()

    def routes(self) -> dict[str, Callable[[bytes], Answer]]:
        return {
            "/mutate": lambda body: self._answer("mutate", body, self._mutate),
            "/validate": lambda body: self._answer("validate", body, self._validate),
            "/guard": lambda body: self._answer("guard", body, self._guard),
        }

    @property
    def in_flight(self) -> int:
        with self._idle:
            return self._busy

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the requests in flight; True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)

    def _answer(
        self, webhook: str, body: bytes, decide: Callable[[Review], tuple[str, bytes]]
    ) -> Answer:
        start = self._clock()
        with self._idle:
            self._busy += 1
        operation = "unknown"
        try:
            review = decode_review(body)
            operation = review.operation or "unknown"
            verdict, out = decide(review)
            answer: Answer = (200, out, JSON)
        except ReviewError as exc:
            verdict, answer = "invalid", (400, f"{exc}\n".encode(), "text/plain")
        finally:
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()
        self.metrics.observe(webhook, operation, verdict, self._clock() - start)
        return answer

    def _mutate(self, review: Review) -> tuple[str, bytes]:
        patch = mutate(review, self.policy)
        return ("patched" if patch else "allowed"), encode_response(review, patch=patch)

    def _validate(self, review: Review) -> tuple[str, bytes]:
        problem = None
        if review.is_pod and not review.sub_resource and review.operation == "CREATE":
            problem = pod_problem(review.object or {}, self.policy)
        return self._verdict("validate", review, problem, 400)

    def _guard(self, review: Review) -> tuple[str, bytes]:
        return self._verdict("guard", review, guard_problem(review, self.policy), 403)

    @staticmethod
    def _verdict(webhook: str, review: Review, problem: str | None, code: int) -> tuple[str, bytes]:
        if problem is None:
            return "allowed", encode_response(review)
        log.info(
            "admission denied",
            webhook=webhook,
            operation=review.operation,
            pod=f"{review.namespace}/{review.name}",
            user=review.user.username,
            reason=problem,
        )
        return "denied", encode_response(review, allowed=False, code=code, message=problem)
