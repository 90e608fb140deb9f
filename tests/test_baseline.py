"""The CI gate's regression test against a saved baseline: McNemar's exact test on the shared cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_retrace.baseline import ALPHA, compare, load, mcnemar_p, save, verdicts
from pytest_retrace.records import Failure, Record


def rec(case: str, recovered: bool | None, model: str = "m", run_index: int = 0) -> Record:
    base = Record.of_error(Failure(stage="x", kind="env", message="-"), nodeid=f"{case}-{model}-{run_index}",
                           case=None, model=model, strategy="implicit", budget=10, run_index=run_index)
    if recovered is None:
        return base.model_copy(update={"case": case})
    verdict = "recovered" if recovered else "not_recovered"
    return base.model_copy(update={"case": case, "verdict": verdict, "error": None, "recovered": recovered})


@pytest.mark.parametrize(("b", "c", "p"), [
    (0, 0, 1.0), (1, 0, 1.0), (5, 0, 0.0625), (6, 0, 0.03125), (6, 1, 0.125), (10, 2, 0.0385742),
])
def test_mcnemar_exact_p_values_by_hand(b: int, c: int, p: float) -> None:
    """2 * P(X <= min(b, c)), X ~ Bin(b + c, 1/2): e.g. 6 vs 1 -> 2 * (1 + 7) / 128 = 0.125;
    10 vs 2 -> 2 * (1 + 12 + 66) / 4096 = 0.0385742."""
    assert mcnemar_p(b, c) == pytest.approx(p, abs=1e-6)
    assert mcnemar_p(c, b) == pytest.approx(p, abs=1e-6)


def test_a_supported_drop_regresses_and_noise_does_not(tmp_path: Path) -> None:
    cases = [f"c{i}" for i in range(10)]
    path = tmp_path / "base.json"
    save(path, "before", [rec(c, True) for c in cases] + [rec("gone", True), rec("err", None)])
    old = load(path)
    # 7 of 10 shared cases lost: p = 2 / 128 < 0.05
    [planted] = compare(old, verdicts([rec(c, i >= 7) for i, c in enumerate(cases)]))
    assert (planted.shared, planted.lost, planted.gained) == (10, 7, 0)
    assert planted.p_value < ALPHA and planted.regressed(max_drop=0) and not planted.regressed(max_drop=80)
    assert "m implicit r=10: 100.0% -> 30.0% on 10 shared case(s) (lost 7, gained 0; McNemar exact p = 0.0156)" \
        == planted.describe()
    # one case lost: a 10-point drop that chance explains (p = 1)
    [noise] = compare(old, verdicts([rec(c, i > 0) for i, c in enumerate(cases)]))
    assert noise.drop_points == pytest.approx(10.0) and noise.p_value == 1.0 and not noise.regressed(0)


def test_a_broken_baseline_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"schema_version": 7}')
    with pytest.raises(ValueError, match=r"bad\.json: schema_version 7, expected 1"):
        load(path)
