"""Shared helpers for the benchmarks: machine description, load, result files."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import scipy

DATASETS = Path(os.environ.get("CURATOR_DATASETS", "/work/shared/datasets"))
RESULTS = Path(__file__).parent / "results"


def _memory_gib() -> float:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    return float("nan")


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        one, five, fifteen = os.getloadavg()
        return f"uptime unavailable; load average {one:.2f} {five:.2f} {fifteen:.2f}"


class Run:
    """Records the machine and its load around a benchmark run."""

    def __init__(self, name: str, command: str) -> None:
        self.name = name
        self.command = command
        self.started = time.time()
        self.uptime_start = _uptime()

    def machine(self) -> dict[str, Any]:
        return {
            "cpus": os.cpu_count(),
            "memory_gib": round(_memory_gib(), 1),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "scipy": scipy.__version__,
            "opendp": version("opendp"),
            "uptime_start": self.uptime_start,
            "uptime_end": _uptime(),
            "wall_seconds": round(time.time() - self.started, 1),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        }

    def machine_md(self, machine: dict[str, Any]) -> str:
        return (
            f"Machine: {machine['cpus']} cores, {machine['memory_gib']} GiB "
            f"({machine['processor']}), Python {machine['python']}, numpy {machine['numpy']}, "
            f"scipy {machine['scipy']}, OpenDP {machine['opendp']}. The machine is shared with "
            f"other engineers; load at start: `{machine['uptime_start']}`, at end: "
            f"`{machine['uptime_end']}`. Wall time {machine['wall_seconds']} s, "
            f"{machine['date_utc']} UTC. Command: `{self.command}`."
        )

    def write(self, markdown: str, payload: dict[str, Any]) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        machine = self.machine()
        payload = {"benchmark": self.name, "command": self.command, "machine": machine} | payload
        (RESULTS / f"{self.name}.json").write_text(json.dumps(payload, indent=2) + "\n")
        (RESULTS / f"{self.name}.md").write_text(
            markdown.rstrip() + "\n\n" + self.machine_md(machine) + "\n"
        )
        print(markdown)
        print(self.machine_md(machine))

    def finish(self, markdown: str, payload: dict[str, Any], *, quick: bool) -> None:
        """End a run: a quick one prints its results and the machine (no file is written);
        a full one writes ``<name>.json`` and ``<name>.md`` (:meth:`write`)."""
        if quick:
            print(markdown)
            print(json.dumps(self.machine()))
            return
        self.write(markdown, payload)
        print(f"wrote {RESULTS / self.name}.json and .md")


def loglog_slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of log y against log x."""
    slope, _ = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope)
