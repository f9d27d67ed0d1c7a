"""Serial against a local Dask cluster, measured in one run: `attnlab results compute` of the same tasks into two
empty stores, once in this process and once on `local:N` (each worker one thread), and the ratio.

    python scripts/bench_cluster.py --models smollm2 --windows 1 --workers 2

Prints the wall time of each, the ratio, and checks that the two stores hold the same numbers (CSV bytes)."""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def _fill(store: Path, args, cluster: str | None) -> float:
    from attnlab import results

    os.environ["ATTNLAB_RESULTS_DIR"] = str(store)
    tasks = results.plan(args.models.split(","), args.windows, "cpu", args.quick)
    t0 = time.perf_counter()
    if cluster is None:
        loaded: dict = {}
        rows = [results.fill(t, loaded) for t in tasks]
    else:
        from attnlab import cluster as C

        rows = C.compute(tasks, cluster, progress=False)
    took = time.perf_counter() - t0
    bad = [r for r in rows if "error" in r]
    if bad:
        raise SystemExit(f"failed tasks: {bad}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2")
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        serial, local = Path(tmp, "serial"), Path(tmp, "local")
        t_serial = _fill(serial, args, None)
        t_local = _fill(local, args, f"local:{args.workers}")
        same = ({p.relative_to(serial): p.read_bytes() for p in serial.rglob("*.csv")}
                == {p.relative_to(local): p.read_bytes() for p in local.rglob("*.csv")})
    print(f"{args.models}, {args.windows} window(s) of each corpus{' (quick)' if args.quick else ''}; "
          f"{os.cpu_count()} CPUs, torch threads in the serial run: {torch.get_num_threads()}")
    print(f"serial          {t_serial:7.1f} s")
    print(f"local:{args.workers:<9d} {t_local:7.1f} s   (workers start, load the model once each, one thread each)")
    print(f"ratio serial / local:{args.workers} = {t_serial / t_local:.2f}; same numbers: {same}")


if __name__ == "__main__":
    main()
