"""How OSWorld's window names are read on our desktops."""

from __future__ import annotations

from pytest_retrace.guest.osworld_work import window_name


def test_google_chrome_windows_are_our_chromiums() -> None:
    # 27 of OSWorld's chrome tasks activate "Google Chrome"; our google-chrome is Debian's chromium
    assert window_name("Google Chrome", by_class=False) == "Chromium"
    assert window_name("New Tab - google chrome", by_class=False) == "New Tab - Chromium"
    assert window_name("google-chrome", by_class=True) == "chromium"
    assert window_name("Google-chrome.Google-chrome", by_class=True) == "chromium.chromium"
    assert window_name("gimp", by_class=True) == "gimp" and window_name("Terminal", by_class=False) == "Terminal"
