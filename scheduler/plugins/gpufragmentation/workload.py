"""The target workload ``M`` of GPUFragmentation: fixed, or learned from recent pods.

Role: turn pods into task shapes (``shape_of``: cpu millicores, per-card milli-GPU, card
count, accepted GPU models) and keep the distribution the fragmentation measure is taken
against (``WorkloadEstimator``):

- fixed: the configured ``shapes`` and their weights (the simulator passes the trace's
  pod-shape counts here);
- learned (``window > 0``): the shapes of the last ``window`` distinct pods the scheduler has
  seen, plus the configured shapes as a prior worth ``seedWeight`` pods. The distribution is
  rebuilt every ``refreshEvery`` new pods, so the plugin's per-node sums are recomputed only
  then.

Either way the paper's "typical pods" rule is applied last: the most frequent shapes making
up ``popularity`` of the weight, renormalized.

Invariants: the window holds at most ``window`` pods, each pod (uid) counted once; the
workload only changes inside ``current()`` and ``generation`` counts those changes; a pod
whose device request is invalid has no shape and is not counted.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from apis.core import CPU, Pod
from apis.device import LABEL_GPU_MODEL
from apis.resources import DEVICE_GPU, InvalidDeviceRequest, device_requests, gpu_split
from scheduler.plugins.gpufragmentation.measure import GPU_MILLI, PodShape, Workload, typical_shapes

__all__ = ["WorkloadConfig", "WorkloadEstimator", "shape_of"]

MILLI_PER_PERCENT = 10


def _models(pod: Pod) -> tuple[str, ...]:
    """GPU models the pod accepts: a nodeSelector on the model label, or a required node
    affinity whose every term has one ``In`` on it (the trace's ``gpu_spec``)."""
    selected = pod.node_selector.get(LABEL_GPU_MODEL)
    if selected:
        return (selected,)
    affinity = pod.node_affinity
    if affinity is None or not affinity.required:
        return ()
    models: set[str] = set()
    for term in affinity.required:
        exprs = [e for e in term.match_expressions if e.key == LABEL_GPU_MODEL]
        if len(exprs) != 1 or exprs[0].operator != "In":
            return ()
        models.update(exprs[0].values)
    return tuple(sorted(models))


def shape_of(pod: Pod) -> PodShape | None:
    """The pod's task shape, None when its device request is invalid (or memory-only)."""
    try:
        converted = device_requests(pod.requests)
    except InvalidDeviceRequest:
        return None
    cpu = pod.requests.get(CPU, 0)
    gpu = converted.get(DEVICE_GPU)
    if not gpu:
        return PodShape(cpu)
    split = gpu_split(gpu)
    per_card = max(split.core_per_gpu or 0, split.ratio_per_gpu or 0) * MILLI_PER_PERCENT
    if per_card <= 0:
        return None
    return PodShape(cpu, min(per_card, GPU_MILLI), split.count, _models(pod))


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """``targetWorkload`` args (see ``args``)."""

    shapes: tuple[tuple[PodShape, float], ...] = ()
    seed_weight: float = 100.0
    window: int = 0
    refresh_every: int = 50
    popularity: float = 0.95


class WorkloadEstimator:
    """The current target workload; see the module docstring."""

    def __init__(self, config: WorkloadConfig) -> None:
        self.config = config
        self._window: OrderedDict[str, PodShape] = OrderedDict()
        self._counts: Counter[PodShape] = Counter()
        self._pending = 0
        self._workload: Workload | None = None
        self.generation = 0

    @property
    def learning(self) -> bool:
        return self.config.window > 0

    def observe(self, uid: str, shape: PodShape | None) -> None:
        """Count a pod the scheduler is looking at (no-op when not learning)."""
        if not self.learning or shape is None or uid in self._window:
            return
        self._window[uid] = shape
        self._counts[shape] += 1
        if len(self._window) > self.config.window:
            _, old = self._window.popitem(last=False)
            self._counts[old] -= 1
            if self._counts[old] <= 0:
                del self._counts[old]
        self._pending += 1

    def current(self) -> Workload:
        if self._workload is None or self._pending >= self.config.refresh_every:
            self._workload = Workload.of(typical_shapes(self._weights(), self.config.popularity))
            self._pending = 0
            self.generation += 1
        return self._workload

    def _weights(self) -> dict[PodShape, float]:
        weights: dict[PodShape, float] = {}
        seed = self.config.shapes
        seed_total = sum(w for _, w in seed)
        scale = self.config.seed_weight / seed_total if self.learning and seed_total else 1.0
        for shape, w in seed:
            weights[shape] = weights.get(shape, 0.0) + w * scale
        for shape, n in self._counts.items():
            weights[shape] = weights.get(shape, 0.0) + n
        return weights

    def window_shapes(self) -> Sequence[PodShape]:
        return tuple(self._window.values())
