"""Peak resident memory of this process (Linux), shared by the benchmark scripts.

``reset_peak_rss()`` clears the kernel's peak mark through ``/proc/self/clear_refs``
and returns the current resident size; ``status_mb("VmHWM")`` afterwards is the
peak since the reset, so ``status_mb("VmHWM") - baseline`` is what a step added.
"""

from __future__ import annotations


def reset_peak_rss() -> float:
    """Reset the kernel's peak-RSS mark (Linux ``clear_refs``); return the current RSS in MB."""
    with open("/proc/self/clear_refs", "w") as stream:
        stream.write("5")
    return status_mb("VmRSS")


def status_mb(field: str) -> float:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``, ...) in MB."""
    with open("/proc/self/status") as stream:
        for line in stream:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")
