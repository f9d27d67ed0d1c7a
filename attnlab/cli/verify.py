"""`attnlab verify-results` (also `attnlab results verify`): compute every stored Result of the results cache again
and compare (before a release: it catches a change that moved numbers where no golden probe looks, or a version that
was not bumped)."""
from __future__ import annotations

import sys

from attnlab.cli.options import quiet_arg


def add_cli(sub) -> None:
    p = sub.add_parser("verify-results", help="compute every stored Result again and compare it with the stored one")
    quiet_arg(p)
    p.set_defaults(func=run_verify)


def recompute(name: str, key: dict):
    """A stored Result computed again from its key (`attnlab.recompute`): None where the registry of computations
    does not declare it, or its key does not say how."""
    from attnlab import recompute as again

    return again.recompute(name, key)


def run_verify(args) -> int:
    """One line per stored Result (name, status, first differences) on stdout, a summary on stderr; 1 when one
    differs or is damaged."""
    from attnlab.core import cache

    counts: dict[str, int] = {}
    for name, status, moved in cache.verify(recompute):
        counts[status] = counts.get(status, 0) + 1
        print(f"{name}: {status}" + (f" ({len(moved)}: {'; '.join(moved[:3])})" if moved else ""), flush=True)
    print(f"attnlab: verified {sum(counts.values())} stored Results in {cache.results_dir()}: "
          + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none"), file=sys.stderr)
    return 1 if counts.get("differs") or counts.get("damaged") else 0
