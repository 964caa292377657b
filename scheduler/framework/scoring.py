"""Score helpers shared by plugins: kube-scheduler's DefaultNormalizeScore, vectorised.

Invariant: results are integers in [0, max_score]; the input array is rewritten in place.
"""

from __future__ import annotations

import numpy as np

from scheduler.framework.types import IntArray

MAX_NODE_SCORE = 100


def default_normalize_score(
    scores: IntArray, reverse: bool = False, max_score: int = MAX_NODE_SCORE
) -> None:
    """Scale ``scores`` so the highest becomes ``max_score`` (reversed: lowest is best)."""
    if scores.size == 0:
        return
    highest = int(scores.max())
    if highest == 0:
        if reverse:
            scores[:] = max_score
        return
    np.floor_divide(scores * max_score, highest, out=scores)
    if reverse:
        np.subtract(max_score, scores, out=scores)
