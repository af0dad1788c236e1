"""Progress reporting hook: library code names its steps; the CLI shows them with rich."""
from __future__ import annotations

import contextlib
import time


class Steps:
    """Silent by default; records how long each step took (reported in the artifact's meta)."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, label: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[label] = self.times.get(label, 0.0) + time.perf_counter() - t0


class RichSteps(Steps):
    """A rich spinner per step, then a tick with its duration (on stderr, so --json stays clean)."""

    def __init__(self, console):
        super().__init__()
        self.console = console

    @contextlib.contextmanager
    def step(self, label: str):
        t0 = time.perf_counter()
        with self.console.status(f"[bold]{label}…"):
            with super().step(label):
                yield
        self.console.print(f"[green]✓[/] {label} [dim]({time.perf_counter() - t0:.2f}s)[/]")
