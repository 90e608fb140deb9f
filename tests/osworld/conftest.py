"""A real `retrace guest` on an Xvfb display, shared by the module's tests (OSWorld's code talks to it)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.guests import Display, Guest


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guest]:
    display = Display()
    served = Guest(display, tmp_path_factory.mktemp("guest") / "home").start()
    yield served
    served.close()
    display.close()
