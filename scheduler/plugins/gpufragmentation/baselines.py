"""The FGD paper's other baselines: DotProduct, GPUClustering and GPUPacking node scores.

Role: the node scores of the three baselines the paper compares FGD with (Weng et al., USENIX
ATC '23, §6; the artifact hkust-adsl/kubernetes-scheduler-simulator, plugins
``dot_product_score.go``, ``gpu_clustering_score.go`` and ``gpu_packing_score.go``), each in a
whole-cluster (numpy) form for ``score_nodes`` and a scalar reference form, written as the
artifact's code reads, for the per-node ``score``. Both forms give the same integers (tests
compare them on random inputs). Scores are integers in 0..100 as in the artifact, so many nodes
tie; the profiles break ties towards the earliest node, as the artifact's scheduler does.

- ``DotProduct`` (Tetris' alignment, the artifact's ``gpusel=best, dimext=merge, norm=max``):
  node vector (free cpu / 128 cores, free GPU / 8 GPUs) before the placement, pod vector (cpu
  / 128 cores, GPU / 8 GPUs); score ``int(100 * (1 - dot / 2))``: the smaller the product,
  the better.
- ``GPUClustering``: a GPU pod's *tag* is "shares a card" or "k whole cards"; a node's tags are
  those of the pods holding its cards. Bands: 75..100 a node holding only pods of the pod's
  tag, 50..75 a node holding that tag among others, 25..50 a node holding none, 0..25 a node
  holding only other tags; within the band ``25 * (8000 - free GPU) // 8000``. A CPU-only pod
  scores 0 everywhere.
- ``GPUPacking``: on a node where every card is idle, ``max(33 - idle cards, idle cards)`` (the
  artifact's cap, kept as it is); otherwise the pod's cards are taken fullest first: when one
  of them is idle, ``max(50 - idle cards taken, 33)``; when all are in use,
  ``max(100 - Σ free % of those cards // 10, 50)``. A CPU-only pod scores 0 everywhere.

Invariants: pure functions; integer results; a node that cannot take the pod (no ``k``
fitting cards) scores as the artifact's error path, 0 — Filter removes it first anyway.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from apis.resources import DEVICE_GPU, GPU_CORE
from scheduler.devices import SHARE
from scheduler.devices.request import Holding

__all__ = [
    "NO_TAG",
    "SHARED_TAG",
    "clustering_one",
    "clustering_scores",
    "dot_product_one",
    "dot_product_scores",
    "holding_tag",
    "node_tags",
    "packing_one",
    "packing_scores",
]

IntArray = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]

MAX_SCORE: Final = 100
MAX_SPEC_CPU: Final = 128_000
MAX_SPEC_GPU: Final = 8 * SHARE
NO_TAG: Final = -1
"""The tag of a pod without GPUs."""
SHARED_TAG: Final = 0
"""The tag of a pod sharing one card; ``k`` (1..8) is the tag of a pod on ``k`` whole cards."""
_MAX_TAG: Final = 62


# -- DotProduct ---------------------------------------------------------------------------------


def dot_product_scores(
    cpu_free: IntArray, gpu_free: IntArray, cpu_req: int, gpu_req: IntArray | int
) -> IntArray:
    """``int(100 * (1 - (cpu_free/128k * cpu_req/128k + gpu_free/8k * gpu_req/8k) / 2))``."""
    dot = (cpu_free / MAX_SPEC_CPU) * (cpu_req / MAX_SPEC_CPU) + (gpu_free / MAX_SPEC_GPU) * (
        np.asarray(gpu_req) / MAX_SPEC_GPU
    )
    out: IntArray = np.trunc(MAX_SCORE * (1.0 - dot / 2.0)).astype(np.int64)
    return out


def dot_product_one(cpu_free: int, gpu_free: int, cpu_req: int, gpu_req: int) -> int:
    node = (cpu_free / MAX_SPEC_CPU, gpu_free / MAX_SPEC_GPU)
    pod = (cpu_req / MAX_SPEC_CPU, gpu_req / MAX_SPEC_GPU)
    dot = node[0] * pod[0] + node[1] * pod[1]
    return int(MAX_SCORE * (1.0 - dot / 2.0))


# -- GPUClustering ------------------------------------------------------------------------------


def holding_tag(holding: Holding) -> int:
    """The tag of a holder from the cards it holds (``NO_TAG`` without a GPU)."""
    gpu = [u for u in holding.uses if u.device_type == DEVICE_GPU]
    cards = {u.minor for u in gpu}
    if not cards:
        return NO_TAG
    if len(cards) == 1 and any(dict(u.resources).get(GPU_CORE, 100) < 100 for u in gpu):
        return SHARED_TAG
    return min(len(cards), _MAX_TAG)


def node_tags(holdings: Iterable[Holding]) -> int:
    """The node's tags as a bit set (bit ``t`` set: some holder has tag ``t``)."""
    bits = 0
    for holding in holdings:
        tag = holding_tag(holding)
        if tag != NO_TAG:
            bits |= 1 << tag
    return bits


def _band_fill(gpu_free: IntArray | int) -> IntArray | int:
    return MAX_SCORE // 4 * (MAX_SPEC_GPU - gpu_free) // MAX_SPEC_GPU


def clustering_scores(pod_tag: int, tags: IntArray, gpu_free: IntArray) -> IntArray:
    """GPUClustering's score of each node (``tags``: bit sets, ``gpu_free``: milli-GPU)."""
    if pod_tag == NO_TAG:
        return np.zeros(len(tags), np.int64)
    mine = 1 << pod_tag
    has = (tags & mine) != 0
    only = tags == mine
    band = np.where(only, 3, np.where(has, 2, np.where(tags == 0, 1, 0)))
    out: IntArray = (MAX_SCORE // 4 * band + _band_fill(gpu_free)).astype(np.int64)
    return out


def clustering_one(pod_tag: int, tags: int, gpu_free: int) -> int:
    if pod_tag == NO_TAG:
        return 0
    fill = MAX_SCORE // 4 * (MAX_SPEC_GPU - gpu_free) // MAX_SPEC_GPU
    if tags & (1 << pod_tag):
        if tags == 1 << pod_tag:
            return fill + MAX_SCORE * 3 // 4
        return fill + MAX_SCORE * 2 // 4
    if tags == 0:
        return fill + MAX_SCORE // 4
    return fill


# -- GPUPacking ---------------------------------------------------------------------------------


def packing_scores(share: IntArray, fits: B, n_cards: IntArray, count: int) -> IntArray:
    """GPUPacking's score of each node: ``share`` (nodes x cards, thousandths free), ``fits``
    (which cards can take the pod), ``n_cards`` (healthy cards), ``count`` cards asked."""
    n = len(share)
    if count <= 0 or n == 0:
        return np.zeros(n, np.int64)
    idle = (share == SHARE).sum(axis=1)
    all_idle = idle == n_cards
    big = np.iinfo(np.int64).max
    width = share.shape[1]
    k = min(count, width)
    fullest = np.sort(np.where(fits, share, big), axis=1)[:, :k]
    enough = (fullest < big).all(axis=1) & (count <= width)
    chosen = np.where(fullest < big, fullest, 0)
    idle_taken = (chosen == SHARE).sum(axis=1)
    free_pct = (chosen * 100 // SHARE).sum(axis=1)
    used_node = np.where(
        idle_taken > 0,
        np.maximum(MAX_SCORE // 2 - idle_taken, MAX_SCORE // 3),
        np.maximum(MAX_SCORE - free_pct // 10, MAX_SCORE // 2),
    )
    out: IntArray = np.where(
        all_idle,
        np.maximum(MAX_SCORE // 3 - idle, idle),
        np.where(enough, used_node, 0),
    ).astype(np.int64)
    return out


def packing_one(shares: Sequence[int], fitting: Sequence[int], n_cards: int, count: int) -> int:
    """The reference: ``shares`` per card, ``fitting`` the indices of the cards that fit."""
    if count <= 0:
        return 0
    idle = sum(1 for s in shares if s == SHARE)
    if idle == n_cards:
        return max(MAX_SCORE // 3 - idle, idle)
    to_use = sorted(fitting, key=lambda j: shares[j])[:count]
    if len(to_use) < count:
        return 0
    idle_taken = sum(1 for j in to_use if shares[j] == SHARE)
    if idle_taken:
        return max(MAX_SCORE // 2 - idle_taken, MAX_SCORE // 3)
    free_pct = sum(shares[j] * 100 // SHARE for j in to_use)
    return max(MAX_SCORE - free_pct // 10, MAX_SCORE // 2)
