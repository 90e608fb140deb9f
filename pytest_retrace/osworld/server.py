"""Where OSWorld's evaluation code reaches a desktop: the VM server's address and ports, as desktop-env's
controllers and getters take them (``DesktopEnv.vm_ip``, ``server_port``, ...)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VMServer:
    host: str
    server_port: int
    chromium_port: int
    vlc_port: int
    platform: str = "Linux"
    screen: tuple[int, int] = (1920, 1080)
