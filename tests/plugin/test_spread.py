"""The order an xdist run hands out tests in: each domain's case files spread evenly over the run."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from pytest_retrace.plugin.collection import spread_evenly


def test_a_suite_collected_app_by_app_is_interleaved() -> None:
    domains = {f"b{i}": "browser" for i in range(4)} | {f"t{i}": "terminal" for i in range(2)}
    assert spread_evenly(domains) == ["b0", "t0", "b1", "b2", "t1", "b3"]


@given(st.lists(st.sampled_from("abcde"), max_size=60))
def test_every_domain_keeps_its_order_and_its_share_of_every_prefix(names: list[str]) -> None:
    domains = {i: name for i, name in enumerate(names)}
    out = spread_evenly(domains)
    assert sorted(out) == list(domains)
    for name in set(names):
        mine = [key for key in out if domains[key] == name]
        assert mine == sorted(mine)  # a domain's files in their collected order
        share = len(mine) / len(names)
        for k in range(1, len(out) + 1):  # every stretch from the start holds about its share of the domain
            held = sum(domains[key] == name for key in out[:k])
            assert abs(held - k * share) <= 1 + len(set(names)) / 2, (name, k, held, k * share)
