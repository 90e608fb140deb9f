"""Confidence intervals of a recovery rate: the Wilson score interval, and its clustered form for repeated runs.

Why the Wilson score interval: benchmark cells are small (often 5-30 cases) and
good or bad agents sit near 0% or 100%. There the usual normal approximation
``p ± z·sqrt(p(1-p)/n)`` breaks down: at 0/10 or 10/10 its width collapses to zero,
and elsewhere it can leave [0, 1]. The Wilson interval stays inside [0, 1], is never
degenerate, and keeps close to nominal coverage for small n, at no extra cost
(closed form, stdlib only).

Repeated runs (``--retrace-runs K``, or runs merged by ``retrace report``) put K trials of each case in a
group. Those are not K·n independent trials: a case an agent recovers once it tends to recover again (a
deterministic baseline always does). So the interval is clustered by case (:func:`cluster_wilson_interval`):
the Wilson interval at the *effective* sample size n_eff = p(1 - p) / V, where V is the cluster-robust
(sandwich, CR0) variance of the pooled rate over cases. A case recovered in all K runs then weighs as one
case, not as K trials; with one trial per case it is exactly the Wilson interval above.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

Z_95: float = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for ``successes`` out of ``n``; ``(0.0, 1.0)`` when ``n == 0``."""
    if n < 0 or not 0 <= successes <= max(n, 0):
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # the bounds are exactly 0 at k = 0 and exactly 1 at k = n; pin them against rounding noise
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def _wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson score bounds of a share ``p`` at a (possibly fractional, effective) sample size ``n`` > 0."""
    z2 = z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z / denom * math.sqrt(max(p * (1 - p), 0.0) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def cluster_wilson_interval(clusters: Iterable[tuple[int, int]], z: float = Z_95) -> tuple[float, float, float]:
    """The 95 % interval of a pooled rate whose trials come in clusters (a case's K runs), and its effective
    sample size: ``(low, high, n_eff)`` from ``(successes, trials)`` per cluster.

    p = Σy / Σn over clusters; V = Σ (y_i - p·n_i)² / (Σn)² is the cluster-robust (CR0) variance of p, which
    makes no assumption about how a case's runs depend on each other; n_eff = p(1 - p) / V (Kish's effective
    sample size, N over the design effect), capped at N, the count of trials, since clustering cannot add
    information. When every trial agrees (p = 0 or 1) V is 0 and says nothing: n_eff is then the count of
    clusters, the conservative reading (each case one trial). So 4 of 10 cases recovered in all 3 runs and 6
    in none give exactly ``wilson_interval(4, 10)``, and one trial per cluster gives ``wilson_interval`` itself.
    """
    cells = [(y, n) for y, n in clusters if n > 0]
    for y, n in cells:
        if not 0 <= y <= n:
            raise ValueError(f"need 0 <= successes <= trials in a cluster, got {y}/{n}")
    total = sum(n for _, n in cells)
    if total == 0:
        return 0.0, 1.0, 0.0
    successes = sum(y for y, _ in cells)
    p = successes / total
    variance = math.fsum((y - p * n) ** 2 for y, n in cells) / total**2
    if successes in (0, total):
        n_eff = float(len(cells))
    else:
        n_eff = total if variance == 0 else min(float(total), p * (1 - p) / variance)
    low, high = _wilson(p, n_eff, z)
    # exactly 0 at no success and 1 at all successes, as wilson_interval
    return (0.0 if successes == 0 else low), (1.0 if successes == total else high), n_eff
