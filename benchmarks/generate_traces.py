"""Write a generated trace folder in the genuine Google 2011 / Alibaba 2018 formats, usable as TVW_TRACE_DIR.

The generator is `tests/fixtures/generate_traces.py` (seeded; see its docstring for the planted cast). Half the
Google tasks are long-running (four usage shapes), one of each special kind (evicted, killed, partial ...), the
rest short finished fillers; the same for Alibaba containers. Prints every file's size and line count, the time
taken, the long-running report the pipeline must produce, and writes `run_config.yaml` (thresholds for the
generated length, gap filling of up to an hour) next to the traces:

    python benchmarks/generate_traces.py --out /tmp/tvw_gen --days 2 --tasks 2000 [--containers 200] [--seed 0]
    TVW_TRACE_DIR=/tmp/tvw_gen TVW_WAREHOUSE_DIR=/tmp/tvw_gen_wh tvw-run --config /tmp/tvw_gen/run_config.yaml
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from pathlib import Path

import yaml

GENERATOR = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "generate_traces.py"
N_GOOGLE_SPECIAL = 13
"""Google tasks of the special kinds (one each): everything but long_running and filler."""
N_ALIBABA_SPECIAL = 6


def load_generator():
    """tests/ is not a package: load the generator module from its file."""
    spec = importlib.util.spec_from_file_location("tvw_generate_traces", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


GENERATE = load_generator()


def split(total: int, n_special: int, min_long: int) -> tuple[int, int]:
    """(long-running, filler) counts for `total` workloads of which `n_special` are the special kinds."""
    n_long = max(min_long, total // 2)
    return n_long, max(0, total - n_long - n_special)


def run_config(planted: dict) -> dict:
    """Thresholds for the generated length; gap filling as the plan assumes; the sample's learning budgets."""
    return {
        "ops": {
            **GENERATE.data_path_config(planted),
            "ec__mapping": {
                "config": {
                    "ec": {"n_init": 10, "dtw": {"window_frac": 0.1, "downsample": 3}},
                    "gain": {"forecaster": {"epochs": 2}},
                }
            },
            "sim__job_sequences": {
                "config": {"n_train_sequences": 10, "n_test_sequences": 5, "step_bins": 6}
            },
        }
    }


def print_sizes(folder: Path, planted) -> tuple[int, int]:
    total_bytes = total_lines = 0
    for (table, name), n_lines in sorted(planted.lines.items()):
        # Google: <folder>/<table>/part-...; Alibaba: <folder>/<table>.csv.gz
        path = folder / name if (folder / name).is_file() else folder / table / name
        size = path.stat().st_size
        total_bytes, total_lines = total_bytes + size, total_lines + n_lines
        print(f"  {path.relative_to(folder.parent)!s:60s} {size / 1e6:9.2f} MB {n_lines:>11,d} lines")
    return total_bytes, total_lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="trace folder to (re)create")
    p.add_argument("--days", type=float, default=2.0, help="trace length in days (>= 1.5)")
    p.add_argument("--tasks", type=int, default=2000, help="Google tasks in all")
    p.add_argument("--containers", type=int, default=200, help="Alibaba containers in all")
    p.add_argument("--shards", type=int, default=None, help="Google shards per table (default: one per 6 h)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compresslevel", type=int, default=6, help="gzip level (1 is faster to write)")
    args = p.parse_args(argv)

    gen = GENERATE
    if args.out.exists():
        shutil.rmtree(args.out)
    shards = args.shards or max(2, round(args.days * 4))
    g_long, g_short = split(args.tasks, N_GOOGLE_SPECIAL, len(gen.SHAPES))
    a_long, a_short = split(args.containers, N_ALIBABA_SPECIAL, 1)
    t0 = time.perf_counter()
    google = gen.write_google2011(
        args.out, args.seed, days=args.days, n_long=g_long, n_short=g_short, n_shards=shards,
        compresslevel=args.compresslevel,
    )  # fmt: skip
    t1 = time.perf_counter()
    alibaba = gen.write_alibaba2018(
        args.out, args.seed, days=args.days, n_long=a_long, n_short=a_short, compresslevel=args.compresslevel
    )
    t2 = time.perf_counter()
    planted = {"google2011": google, "alibaba2018": alibaba}
    config = args.out / "run_config.yaml"
    config.write_text(yaml.safe_dump(run_config(planted), sort_keys=False))

    for source, plan, seconds in (("google2011", google, t1 - t0), ("alibaba2018", alibaba, t2 - t1)):
        print(
            f"{source}: {len(plan.kinds):,d} workloads, {plan.n_bins} five-minute bins, written in {seconds:.1f}s"
        )
        size, lines = print_sizes(plan.folder, plan)
        print(
            f"  total {size / 1e6:.2f} MB gzip, {lines:,d} lines ({lines / max(seconds, 1e-9):,.0f} lines/s)"
        )
        print(
            f"  expected long-running report: {plan.report} ({plan.rule} >= {plan.min_contiguous_bins} bins)"
        )
        print(f"  planted malformed rows: {len(plan.malformed)}")
    print(f"run config: {config}")
    print(f"try: TVW_TRACE_DIR={args.out} TVW_WAREHOUSE_DIR={args.out}_wh tvw-run --config {config}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
