"""The final set of `retrace build`: a fixed-seed sample per domain that keeps every kind of mistake, and the
paper's Tables 6 and 7 that describe it."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from pytest_retrace.dataset.trajectory import Trajectory
from pytest_retrace.replay.cases import KINDS


def sample_per_domain(candidates: list[dict[str, Any]], trajs: dict[str, Trajectory], per_domain: int,
                      seed: int) -> tuple[list[dict[str, Any]], int]:
    """At most ``per_domain`` candidates of each domain, and how many were sampled out."""
    by_domain: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for cand in candidates:
        by_domain[trajs[cand["trajectory"]].task.domain].append(cand)
    rng = random.Random(seed)
    chosen: list[dict[str, Any]] = []
    sampled_out = 0
    for domain in sorted(by_domain):
        cands = sorted(by_domain[domain], key=lambda c: c["id"])
        # kinds in turn (each shuffled with the fixed seed), so that a domain's sample keeps every kind it
        # has, as evenly as the candidates allow, rather than the most common one
        per_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for c in cands:
            per_kind[c["kind"]].append(c)
        for group in per_kind.values():
            rng.shuffle(group)
        pick = []
        while len(pick) < per_domain and any(per_kind.values()):
            for kind in sorted(per_kind):
                if per_kind[kind] and len(pick) < per_domain:
                    pick.append(per_kind[kind].pop(0))
        sampled_out += len(cands) - len(pick)
        chosen += sorted(pick, key=lambda c: c["id"])
    return chosen, sampled_out


def print_tables(log: Callable[[str], object], counts: list[tuple[str, int]], trajs: dict[str, Trajectory],
                 chosen: list[dict[str, Any]]) -> None:
    """Table 6 (what each stage kept, ``counts``) and Table 7 (the final set's domains by kind and horizon)."""
    log("\nTable 6: counts after each stage")
    labels = {"rollouts": "# of traj. after formatting", "consistent": "# of traj. after transition-consistent "
              "filtering", "seeds": "# of (traj., t_seed) targets", "perturb": "# of candidates after perturbation",
              "final": "# of cases after final set construction"}
    for stage, n in counts:
        log(f"  {labels[stage]:<52} {n:>5}")
    log("\nTable 7: domain composition of the final set")
    table: dict[str, Counter[str]] = defaultdict(Counter)
    for c in chosen:
        dom = trajs[c["trajectory"]].task.domain
        table[dom][c["kind"]] += 1
        table[dom][c["horizon"]] += 1
    cols = [*KINDS, "short", "long"]
    w = max([14, *(len(d) + 1 for d in table)])  # OSWorld's domains are longer (libreoffice_impress)
    log("  " + f"{'domain':<{w}}" + "".join(f"{c:>14}" for c in cols) + f"{'total':>8}")
    for dom in sorted(table):
        total = sum(table[dom][k] for k in KINDS)
        log("  " + f"{dom:<{w}}" + "".join(f"{table[dom][c]:>14}" for c in cols) + f"{total:>8}")
    log(f"  {'all':<{w}}" + "".join(f"{sum(t[c] for t in table.values()):>14}" for c in cols)
             + f"{len(chosen):>8}")
