"""Intervals for the research benchmarks: a percentile bootstrap that resamples whole clusters (tasks, seeds,
replicates), so that paths of one task, which share a prompt and a prefix, count as one draw."""

from __future__ import annotations

import math
import random
from typing import Any, Callable, Sequence


def cluster_bootstrap(clusters: Sequence[Any], statistic: Callable[[list[Any]], float], resamples: int = 2000,
                      seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
    """(the statistic on `clusters`, the low and high ends of its `level` percentile interval): each resample draws
    as many clusters as there are, with replacement. Resamples whose statistic is undefined (nan) are left out."""
    estimate = statistic(list(clusters))
    rng = random.Random(seed)
    draws = []
    for _ in range(resamples):
        value = statistic([clusters[rng.randrange(len(clusters))] for _ in clusters])
        if math.isfinite(value):
            draws.append(value)
    if not draws:
        return estimate, math.nan, math.nan
    draws.sort()
    tail = (1 - level) / 2
    return estimate, draws[int(tail * (len(draws) - 1))], draws[int(math.ceil((1 - tail) * (len(draws) - 1)))]


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of y on x (a linear probability model when y is 0 or 1); nan when x does not vary."""
    n = len(points)
    if n < 2:
        return math.nan
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return math.nan if sxx == 0 else sum((x - mx) * (y - my) for x, y in points) / sxx


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def interval(estimate: float, low: float, high: float, digits: int = 3) -> str:
    """``0.123 [0.045, 0.201]``."""
    return f"{estimate:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
