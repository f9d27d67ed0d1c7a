"""Time and peak memory of whole runs, measured on this project's 2-core, 24 GiB CPU machine (`/usr/bin/time -v`;
BENCHMARKS.md gives each run's command, commit and the machine's load). One list, read by the models page's memory
table (scripts/models_table.py) and by the test of the workers' memory estimate (tests/test_cluster_plan.py).
Measured, not derived: a new measurement is a new row here and in BENCHMARKS.md.

No torch here: the page's generator reads this module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Cost:
    model: str                  # the model table's name
    what: str                   # what ran: `attnlab figures IDS --model M --max-length L`
    length: int                 # L, the longest window
    peak_gb: float              # the process's maximum resident memory, GB (1e9 bytes)
    wall_s: Optional[float]     # wall time of the whole run (load, passes, figures, PNGs); None: not recorded
    cpu_s: Optional[float]      # user + system CPU seconds; None: not recorded
    quiet: bool                 # nothing else ran on the machine (else its wall time is up to 3x a quiet one's)
    measured: str               # the date, and BENCHMARKS.md's section
    dearest: bool = False       # the model's dearest run at this L (the memory estimate must sit close above it)
    readings: bool = False      # it computed the readings (`results.worker_memory(..., readings=True)` sizes it)


FIG12A = "fig1 fig2a"
SIX = "fig1 fig2a fig2b fig2c fig3 fig4"
BOOK_WINDOW = "the book's window (`results compute`)"     # every figure and reading, perplexity, diagnose, comparison

COSTS: tuple[Cost, ...] = (
    Cost("gpt2-random", FIG12A, 1024, 2.60, 15.2, None, True, "2026-11-27, Long context"),
    Cost("smollm2", FIG12A, 1024, 3.95, 16.8, None, True, "2026-11-27, Long context"),
    Cost("smollm2", FIG12A, 2048, 4.89, 35.2, None, True, "2026-11-27, Long context"),
    Cost("smollm2", FIG12A, 4096, 4.58, 88.0, None, True, "2026-11-27, Long context"),
    Cost("smollm2", FIG12A, 8192, 6.52, 316.0, None, True, "2026-11-27, Long context", dearest=True),
    Cost("smollm2", "fig2c", 2048, 9.9, 135.0, None, True, "2026-11-26, SmolLM2 (causal, 270 heads)", dearest=True),
    Cost("smollm2", SIX, 1024, 5.49, 183.5, None, True, "2026-11-26, SmolLM2 (causal, 270 heads)", dearest=True),
    Cost("smollm2", "thm1_readings", 1024, 8.81, 1219.7, 892.4, False, "2026-11-30, Twenty-second session",
         readings=True),
    Cost("smollm2", BOOK_WINDOW, 1024, 10.74, 2203.3, 2296.4, False, "2026-11-30, Twenty-second session",
         dearest=True, readings=True),
    Cost("gemma3", SIX, 1024, 5.35, 491.0, 246.5, False, "2026-11-29, Gemma 3 270M ... measured again"),
    Cost("gemma3", SIX, 1024, 5.56, 70.1, 124.9, True, "2026-11-29, Seventeenth session (d1's band)"),
    Cost("gemma3", FIG12A, 4096, 11.82, 656.0, 414.3, False, "2026-11-29, Gemma 3 270M ... measured again"),
    Cost("gemma3", FIG12A, 8192, 7.06, 1162.0, 2123.7, True, "2026-11-29, Gemma 3 270M ... measured again",
         dearest=True),
)


def duration(seconds: Optional[float]) -> str:
    """'16.8 s', '5 min 16 s', or '' (not recorded)."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    return f"{int(seconds // 60)} min {round(seconds % 60)} s"


def table_markdown(costs=COSTS) -> str:
    """The models page's memory table, one row per run."""
    head = ("| model | run (`attnlab figures ...`) | L | peak memory | wall time | CPU (user + system) | machine |\n"
            "|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| `{c.model}` | {c.what} | {c.length:,} | {c.peak_gb:.2f} GB | {duration(c.wall_s)} | "
        f"{duration(c.cpu_s)} | {'quiet' if c.quiet else 'shared (wall up to 3x)'}, {c.measured.split(',')[0]} |\n"
        for c in costs)
