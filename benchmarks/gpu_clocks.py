"""The GPU's SM clock and power while a benchmark cell runs, sampled by `nvidia-smi` in the background.

Under sustained load an H200 runs at its power cap, and its clock (and so a forward's time) moves with it from
one machine start, or one minute, to the next: a cell measured in a slow spell reads as a slower GPU time per
document with nothing changed in the code. `GpuClocks` samples the clock and the power every `interval_ms` while
a cell runs, so each cell can carry them (median, and the lowest clock) next to its rates.

    with GpuClocks("cuda") as clocks:
        ...  # the cell
    clocks.summary()  # {"sm_mhz": 1770, "sm_mhz_min": 1395, "power_w": 660.2, "samples": 40}, or {} without

Where `nvidia-smi` is missing (a CPU, another vendor) or gives nothing, `summary()` is empty.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading

import torch

QUERY = "clocks.sm,power.draw"


def physical_index(device: str) -> str:
    """The index `nvidia-smi` knows the torch device by (through CUDA_VISIBLE_DEVICES where it is set)."""
    index = torch.device(device).index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return visible.split(",")[index].strip()
    return str(index)


def parse(line: str) -> tuple[float, float] | None:
    """(SM clock in MHz, power in W) from one line of `--format=csv,noheader,nounits`; None if it is not one."""
    fields = [field.strip() for field in line.split(",")]
    try:
        return float(fields[0]), float(fields[1])
    except (IndexError, ValueError):  # "[N/A]", a header, an error message
        return None


class GpuClocks:
    """`nvidia-smi` sampling the clock and power of `device` from entry to exit (see the module's docstring)."""

    def __init__(self, device: str, interval_ms: int = 250):
        self.samples: list[tuple[float, float]] = []
        self.process: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        smi = shutil.which("nvidia-smi")
        if smi is None or not device.startswith("cuda"):
            return
        command = [smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", f"--loop-ms={interval_ms}"]
        self.command = [*command, f"--id={physical_index(device)}"]

    def __enter__(self) -> GpuClocks:
        if getattr(self, "command", None):
            self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            sample = parse(line)
            if sample is not None:
                self.samples.append(sample)

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.reader.join(timeout=10)

    def summary(self) -> dict[str, float]:
        """The median SM clock (MHz), the lowest, and the median power (W) over the samples; {} without any."""
        if not self.samples:
            return {}
        clocks, power = zip(*self.samples)
        return {
            "sm_mhz": statistics.median(clocks),
            "sm_mhz_min": min(clocks),
            "power_w": round(statistics.median(power), 1),
            "samples": len(self.samples),
        }
