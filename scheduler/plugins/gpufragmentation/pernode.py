"""GPUFragmentation's per-node form: one node's score, written as the definition reads.

Role: the reference the whole-cluster ``score_nodes`` is checked against (both must agree on
every node, tests compare them on random clusters) and the ``score`` extension point. It takes
its inputs by another path than the batch form: the node's cards from the ledger's
``node_view`` (not the matrices, the per-row cache or the slot-to-row map), each card's free
milli-GPU computed here from its free and total amounts, the fit and what the pod takes from
each card from DeviceShare's per-card reference ``card_amounts`` (not the vectorized
``card_fits`` / ``card_left``), and ``F_n(M)`` from the measure's reference
``node_fragmentation`` (not the grouped ``Workload`` arithmetic). Only the final arithmetic of
a score (``primary`` and ``with_ties``: quantization and the packing of the tie-break key) is
shared, on purpose, so that both forms apply the very same float operations.

Invariants: pure functions; a node that cannot take the pod has ``after = inf`` (primary
``-PRIMARY_LIMIT``) and takes 0 milli-GPU; a card's free milli-GPU is the least over its
declared resources of ``free * 1000 // total`` (the ledger's ``share``), 0 without any.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from apis.resources import DEVICE_GPU
from scheduler.devices import SHARE, CardView, DeviceRequest, TypeRequest
from scheduler.devices.allocator import card_amounts
from scheduler.plugins.gpufragmentation.args import (
    BEST_FIT,
    CLUSTERING,
    DOT_PRODUCT,
    FRAGMENTATION_GRADIENT,
    PACKING,
    RANDOM,
    SIGMOID,
    TIE_FIRST,
    TIE_PACKING,
    TIE_SMALLEST,
    GPUFragmentationArgs,
)
from scheduler.plugins.gpufragmentation.baselines import (
    NO_TAG,
    SHARED_TAG,
    clustering_one,
    dot_product_one,
    packing_one,
)
from scheduler.plugins.gpufragmentation.measure import GPU_MILLI, Workload, node_fragmentation

__all__ = [
    "MAX_SPEC_CPU",
    "MAX_SPEC_GPU",
    "PRIMARY_LIMIT",
    "TIE_BITS",
    "PodRequest",
    "card_share",
    "node_score",
    "pod_tag",
    "primary_best_fit",
    "primary_gradient",
    "with_ties",
]

PRIMARY_LIMIT: Final = 1 << 20
"""Primary keys are clipped to [-2^20, 2^20); with the tie-break fields the key fits 62 bits."""
TIE_BITS: Final = {TIE_SMALLEST: 6, TIE_PACKING: 16, TIE_FIRST: 19}
MAX_SPEC_CPU: Final = 128_000
MAX_SPEC_GPU: Final = 8 * GPU_MILLI

IntArray = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What GPUFragmentation needs of a pod: cpu millicores and its parsed device request
    (None without one); ``valid`` is False when DeviceShare would reject the request."""

    cpu: int
    request: DeviceRequest | None
    valid: bool = True

    @property
    def gpu(self) -> TypeRequest | None:
        return self.request.type_request(DEVICE_GPU) if self.request is not None else None

    @property
    def one_card(self) -> bool:
        gpu = self.gpu
        return gpu is not None and gpu.count == 1

    @property
    def shared(self) -> bool:
        """On one card, sharing it (the case where the card choice is ours to make)."""
        gpu = self.gpu
        return gpu is not None and gpu.count == 1 and gpu.shared


def card_share(total: Sequence[int], free: Sequence[int]) -> int:
    """A card's free part in thousandths: the least over declared resources."""
    parts = [max(f, 0) * SHARE // t for t, f in zip(total, free, strict=True) if t > 0]
    return min(parts) if parts else 0


def pod_tag(pod: PodRequest) -> int:
    """GPUClustering's tag of the pod: sharing a card, or the number of whole cards."""
    gpu = pod.gpu
    if gpu is None or gpu.count <= 0:
        return NO_TAG
    return SHARED_TAG if pod.shared else gpu.count


def primary_gradient(
    args: GPUFragmentationArgs,
    rate: F64,
    before: F64,
    after: F64,
    total: IntArray,
    left: IntArray,
    cpu: IntArray,
    cpu_after: IntArray,
    reach: F64 | None = None,
    pinned: F64 | None = None,
) -> IntArray:
    """The quantized gain ``-(F' - F + strandedWeight x stranded change)``; infeasible nodes
    (``after`` inf) get ``-PRIMARY_LIMIT``. ``rate``: per node, the millicores per milli-GPU
    that the GPU tasks able to run there ask for (``Workload.cpu_per_gpu_of`` its model; 0:
    none can, and the node has no stranded-GPU term). ``reach``: per node, the share of GPU
    tasks that accept its model (``Workload.reach_of``), scaling the term when
    ``strandedReach`` is set. ``pinned``: per node, ``pinnedWeight x taken x pressure`` of
    its model (0 when off), added as is."""
    delta = after - before
    if pinned is not None:
        delta = delta + pinned
    weight = args.stranded_weight
    if weight > 0 and bool((rate > 0).any()):
        fed = rate > 0
        safe = np.where(fed, rate, 1.0)
        stranded_before = np.maximum(total - cpu / safe, 0.0)
        stranded_after = np.maximum(left - cpu_after / safe, 0.0)
        scale = weight * reach if args.stranded_reach and reach is not None else weight
        delta = delta + np.where(fed, scale * (stranded_after - stranded_before), 0.0)
    finite = np.isfinite(delta)
    gain = -np.where(finite, delta, 0.0)
    if args.quantization == SIGMOID:
        primary = (100.0 / (1.0 + np.exp(-gain / GPU_MILLI))).astype(np.int64)
    else:
        primary = np.floor(gain / args.resolution).astype(np.int64)
    primary[~finite] = -PRIMARY_LIMIT
    out: IntArray = primary
    return out


def primary_best_fit(cpu_left: IntArray, gpu_left: IntArray) -> IntArray:
    """BestFit: the less cpu and GPU left (normalized to the largest node), the better."""
    waste = 0.5 * cpu_left / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU
    out: IntArray = np.round(-waste * 1e6).astype(np.int64)
    return out


def with_ties(
    tie_break: Sequence[str],
    primary: IntArray,
    n_cards: IntArray,
    left: IntArray,
    slots: IntArray,
) -> IntArray:
    """``primary``, then each tie-break criterion, packed into one int64 key (higher is
    better): SmallestNode (fewest GPU cards), Packing (least GPU left), FirstFit (lowest
    snapshot slot, i.e. the node known longest)."""
    raw: IntArray = np.clip(primary, -PRIMARY_LIMIT, PRIMARY_LIMIT - 1) + PRIMARY_LIMIT
    for criterion in tie_break:
        width = TIE_BITS[criterion]
        top = (1 << width) - 1
        if criterion == TIE_SMALLEST:
            value = n_cards
        elif criterion == TIE_PACKING:
            value = np.maximum(left, 0)
        else:
            value = slots
        raw = (raw << width) | (top - np.clip(value, 0, top))
    return raw


def _left_on(card: CardView, amounts: Sequence[int]) -> int:
    return card_share(card.total, [f - a for f, a in zip(card.free, amounts, strict=True)])


def node_score(
    args: GPUFragmentationArgs,
    workload: Workload,
    pod: PodRequest,
    cards: Sequence[CardView],
    model: str,
    cpu_free: int,
    slot: int,
    tags: int = 0,
    pressure: float = 0.0,
) -> int:
    """The raw score of one node (``cards``: its GPUs, by minor) for ``pod``; ``tags``: the
    GPUClustering tag bit set of the pods holding the node's cards; ``pressure``: the
    pinned-demand pressure of its model (``pinnedWeight``), computed by the caller."""
    if not pod.valid:
        return 0
    shares = [card_share(c.total, c.free) for c in cards]
    total = sum(shares)
    cpu_after = cpu_free - pod.cpu
    gpu = pod.gpu
    fitting: list[tuple[int, int]] = []  # (card index, share left on it)
    if gpu is not None:
        for j, card in enumerate(cards):
            amounts = card_amounts(gpu, card)
            if amounts is not None:
                fitting.append((j, _left_on(card, amounts)))
    mapping = workload.as_mapping()
    inf = float("inf")
    taken = 0
    after = inf
    strategy = args.strategy
    if gpu is None:
        after = node_fragmentation(cpu_after, shares, model, mapping)
    elif gpu.count == 1 and fitting:
        if strategy == FRAGMENTATION_GRADIENT:
            best: tuple[float, int, int, int] | None = None
            for j, left_on in fitting:
                trial = list(shares)
                trial[j] = left_on
                value = node_fragmentation(cpu_after, trial, model, mapping)
                key = (value, shares[j], j, shares[j] - left_on)
                if best is None or key[:3] < best[:3]:
                    best = key
            assert best is not None
            after, taken = best[0], best[3]
        else:
            j, left_on = min(fitting, key=lambda f: (shares[f[0]], f[0]))
            taken = shares[j] - left_on
    elif gpu.count > 1 and len(fitting) >= gpu.count:
        trial = list(shares)
        for j, left_on in fitting[: gpu.count]:
            trial[j] = left_on
        taken = total - sum(trial)
        after = node_fragmentation(cpu_after, trial, model, mapping)
    n_cards = np.array([sum(1 for c in cards if c.healthy)], np.int64)
    left = np.array([total - taken], np.int64)
    slots = np.array([slot], np.int64)
    if strategy == RANDOM:
        primary = np.zeros(1, np.int64)
    elif strategy == BEST_FIT:
        primary = primary_best_fit(np.array([cpu_after], np.int64), left)
    elif strategy == DOT_PRODUCT:
        primary = np.array([dot_product_one(cpu_free, total, pod.cpu, taken)], np.int64)
    elif strategy == CLUSTERING:
        primary = np.array([clustering_one(pod_tag(pod), tags, total)], np.int64)
    elif strategy == PACKING:
        count = gpu.count if gpu is not None else 0
        fit_idx = [j for j, _ in fitting]
        primary = np.array([packing_one(shares, fit_idx, int(n_cards[0]), count)], np.int64)
    else:
        before = node_fragmentation(cpu_free, shares, model, mapping)
        primary = primary_gradient(
            args,
            np.array([workload.cpu_per_gpu_of(model)]),
            np.array([before]),
            np.array([after]),
            np.array([total], np.int64),
            left,
            np.array([cpu_free], np.int64),
            np.array([cpu_after], np.int64),
            np.array([workload.reach_of(model)]),
            np.array([args.pinned_weight * taken * pressure]) if args.pinned_weight > 0 else None,
        )
    return int(with_ties(args.tie_break, primary, n_cards, left, slots)[0])
