"""The one test every recovery case runs. Collected per case file (collection.CaseFile) and parametrized
as ``test_recovery[<case>-<model>-<strategy>]``; the fixtures (fixtures.py) build the desktop, replay the
case and run the agent during setup, so an infrastructure failure is a pytest *error*, never a failure."""

from __future__ import annotations

from pytest_retrace.experiments.forward import ForwardResult
from pytest_retrace.plugin.assertion import recovered, solved
from pytest_retrace.replay.result import RecoveryResult


def test_recovery(retrace_result: RecoveryResult) -> None:
    assert retrace_result == recovered


def test_forward(retrace_forward_result: ForwardResult) -> None:
    assert retrace_forward_result == solved
