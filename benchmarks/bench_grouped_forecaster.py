"""The EC proxy's forecaster fits one at a time against side by side (`models/grouped_forecaster.py`).

One forecaster seed of the prediction-gain proxy fits the EC-agnostic model and one model per EC of every mapping
and of each of its random controls. This times those fits, on generated series, both ways in the same process:
one LSTNet per member set (`fit_forecaster` + `predict_series`, as the proxy did until 2026-11-27) and every member
set as a slice of one stacked model (`fit_predict_many`). Prints seconds each way, the ratio, and the largest
difference between their predictions (float rounding only).

    PYTHONPATH=. python benchmarks/bench_grouped_forecaster.py [--n 971] [--mappings 3] [--k 5] [--controls 5]
        [--preset sample|small] [--device cpu|cuda]

--preset sample is the sample and quick profiles' proxy LSTNet (1 h window, 8 channels and GRU units, 12 Adam
steps of 128 windows, at most 256 windows); small is ForecasterConfig's defaults (window 24, 16 units, at least 100
steps, at most 2,000 windows). --device cuda fits both ways on a GPU (where one is lent).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from models.forecaster import ForecasterConfig, fit_forecaster, predict_series, series_stats
from models.grouped_forecaster import fit_predict_many

PRESETS = {
    "sample": ForecasterConfig(
        window=12, conv_channels=8, hidden_size=8, epochs=1, min_steps=12, max_train_windows=256
    ),
    "small": ForecasterConfig(),
}


def series(n: int, length: int, seed: int) -> list[np.ndarray]:
    """n (cpu, mem) series: daily sines with random phase and level plus noise (5-minute bins)."""
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    out = []
    for _ in range(n):
        level, amp, phase = rng.uniform(0.1, 0.6, 2), rng.uniform(0.0, 0.2, 2), rng.uniform(0, 2 * np.pi, 2)
        wave = level[:, None] + amp[:, None] * np.sin(2 * np.pi * t[None, :] / 288 + phase[:, None])
        out.append(np.clip(wave + rng.normal(0, 0.02, (2, length)), 0, 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=971, help="workloads (the sample's Google-derived: 971)")
    ap.add_argument("--length", type=int, default=400, help="bins per series")
    ap.add_argument("--mappings", type=int, default=3, help="mappings of one method (k = 3..5 in the sample)")
    ap.add_argument("--k", type=int, default=5, help="ECs per mapping")
    ap.add_argument("--controls", type=int, default=5, help="random controls per mapping")
    ap.add_argument("--min-members", type=int, default=5)
    ap.add_argument("--preset", default="sample", choices=sorted(PRESETS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--device", default="cpu", help="torch device of every fit: cpu, or cuda where a GPU is lent"
    )
    args = ap.parse_args()
    cfg = replace(PRESETS[args.preset], device=args.device)
    values = series(args.n, args.length, args.seed)
    n_train = [int(0.7 * args.length)] * args.n
    rng = np.random.default_rng(args.seed + 1)
    sets = [np.arange(args.n)]
    for _ in range(args.mappings * (1 + args.controls)):
        labels = rng.integers(0, args.k, args.n)
        sets += [m for g in range(args.k) if (m := np.flatnonzero(labels == g)).size >= args.min_members]
    stats = series_stats(values, n_train)
    print(
        f"{len(sets)} fits of one forecaster seed on {args.n} workloads ({args.preset} preset, {args.device})",
        flush=True,
    )
    t0 = time.perf_counter()
    one = []
    for m in sets:
        part, nt = [values[j] for j in m], [n_train[j] for j in m]
        one.append(predict_series(fit_forecaster(part, nt, cfg), part, nt))
    t1 = time.perf_counter()
    grouped = fit_predict_many(values, n_train, sets, cfg, stats)
    t2 = time.perf_counter()
    pairs = [(a, b) for x, y in zip(one, grouped, strict=True) for a, b in zip(x, y, strict=True)]
    diff = max(float(np.abs(a - b).max()) for a, b in pairs)
    print(f"one at a time: {t1 - t0:.2f} s ({(t1 - t0) / len(sets) * 1e3:.1f} ms per fit)")
    print(f"side by side:  {t2 - t1:.2f} s ({(t2 - t1) / len(sets) * 1e3:.1f} ms per fit)")
    print(f"ratio {(t1 - t0) / (t2 - t1):.1f}x, largest prediction difference {diff:.2e}")


if __name__ == "__main__":
    main()
