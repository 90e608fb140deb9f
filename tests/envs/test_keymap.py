"""Keysyms and key names for typing any character (the X side is tested in test_env.py)."""

from __future__ import annotations

import pytest

from pytest_retrace.envs import EnvError
from pytest_retrace.envs.xvfb.keymap import key_name, keysym


@pytest.mark.parametrize(("char", "sym", "name"), [
    ("a", 0x61, "U0061"), (" ", 0x20, "U0020"), ("é", 0xE9, "U00E9"), ("É", 0xC9, "U00C9"),
    ("€", 0x10020AC, "U20AC"), ("中", 0x1004E2D, "U4E2D"), ("😀", 0x101F600, "U1F600"),
])
def test_a_character_types_as_its_unicode_keysym(char: str, sym: int, name: str) -> None:
    assert keysym(char) == sym and key_name(char) == name


def test_tab_and_carriage_return_are_keys_and_other_control_characters_are_refused() -> None:
    assert key_name("\t") == "Tab" and key_name("\r") == "Return"
    with pytest.raises(EnvError, match=r"'\\x07'"):
        key_name("\x07")
