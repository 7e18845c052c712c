"""The line every benchmark prints about the machine its figures came from."""

from __future__ import annotations

import os
import platform


def describe() -> str:
    """``host: CPU model, N CPUs, Python X.Y.Z``."""
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()}: {cpu or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
