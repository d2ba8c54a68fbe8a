"""The paper-size LSTNet (Lai et al. 2018, `models.forecaster.paper_scale`) fitted once, globally, on the real
Bitbrains VMs: where the time goes, and a schedule that makes the fit feasible (issue 20 item 5).

The series are each long-running VM's kept window as the paper profile builds it (5-minute bins, gaps of up to
2 bins filled linearly, the 6000-bin contiguous rule), split like the prediction-gain proxy (first 70 % of each
series trains, the rest is scored). Per schedule it prints: training windows per epoch, seconds per epoch (CPU
time with one torch thread on the CPU, where a shared machine would inflate wall time; wall time otherwise),
epochs run, the whole fit's wall and CPU time, the validation loss of the kept weights, and the test MSE on the held-out
30 % (standardised units, each VM's own training mean/std) beside two baselines (the last observed bin, and
each VM's training mean). It ends with the projection of Table 1 at the
paper profile (every k 3..15 of 3 methods, 1 + 5 control sides, 10 seeds: 2,350 data-sized fits).

    python benchmarks/bench_paper_forecaster.py                       # two paper epochs + the feasible fit
    python benchmarks/bench_paper_forecaster.py --schedules paper_feasible --threads 2
    python benchmarks/bench_paper_forecaster.py --save-series /tmp/bb.npz   # then, on a GPU machine:
    python benchmarks/bench_paper_forecaster.py --series /tmp/bb.npz --device cuda --amp both

Schedules (`--schedules`): `paper_epoch` (the paper's schedule, every window, timed for --paper-epochs epochs
and projected to its 100; no early stopping), `paper_feasible` (every 6th window, 10 % validation, patience 5; --strides tries others),
`stride1_es` (every window with the same early stopping: what striding gives up; for a GPU). The first epoch
also builds the windows, so seconds per epoch are the median of the later epochs when there are any.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from models.forecaster import (  # noqa: E402
    ForecasterConfig,
    fit_forecaster,
    paper_feasible,
    paper_scale,
    predict_series,
    series_stats,
)

TRAIN_FRAC = 0.7  # models.prediction_gain.GainConfig.train_frac
TABLE1_FITS = 10 * (1 + (1 + 5) * 3 * 13)  # seeds x (global + (EC + 5 controls) x 39 mappings): 2,350


def bitbrains_series(traces: Path) -> list[np.ndarray]:
    """Each long-running Bitbrains VM's kept window, (2, L_i), through the pipeline's own functions."""
    from benchmarks.bitbrains_data import bitbrains_long_running
    from pipelines.features import series_matrix

    _, usage, kept = bitbrains_long_running(traces)
    return list(series_matrix(usage, kept, None).values)


def load_series(a: argparse.Namespace) -> list[np.ndarray]:
    if a.series:
        with np.load(a.series) as z:
            return [z[k] for k in sorted(z.files, key=int)]
    traces = Path(a.traces)
    if not (traces / "bitbrains-gwa-t-12").is_dir():
        raise SystemExit(f"{traces}: no bitbrains-gwa-t-12/ folder (give --traces or --series)")
    t0 = time.perf_counter()
    series = bitbrains_series(traces)
    print(f"built {len(series)} VM series from {traces} in {time.perf_counter() - t0:.1f} s", flush=True)
    if a.save_series:
        np.savez_compressed(a.save_series, **{str(i): s.astype(np.float32) for i, s in enumerate(series)})
        print(f"saved to {a.save_series}")
    return series


def test_mse(fitted, series: list[np.ndarray], n_train: list[int]) -> tuple[float, float, float]:
    """MSE over every held-out bin in each VM's standardised units: the model, last observed bin, training mean."""
    mean, std = series_stats(series, n_train)
    preds = predict_series(fitted, series, n_train)
    err = {"model": [], "last": [], "mean": []}
    for i, (s, nt, p) in enumerate(zip(series, n_train, preds, strict=True)):
        z = (s[:, nt:] - mean[i][:, None]) / std[i][:, None]
        zp = (p - mean[i][:, None]) / std[i][:, None]
        zl = (s[:, nt - 1 : -1] - mean[i][:, None]) / std[i][:, None]  # horizon 1: the previous bin
        err["model"].append(((z - zp) ** 2).ravel())
        err["last"].append(((z - zl) ** 2).ravel())
        err["mean"].append((z**2).ravel())
    return tuple(float(np.mean(np.concatenate(err[k]))) for k in ("model", "last", "mean"))


def run_schedule(name: str, cfg: ForecasterConfig, series, n_train, a) -> tuple[float, float]:
    """Fit, print the figures; returns (seconds per window and epoch, seconds of the whole fit)."""
    t_epoch: list[float] = []
    c_epoch: list[float] = []
    t_last = [time.perf_counter(), time.process_time()]

    def progress(epoch: int, loss: float, val: float | None) -> None:
        now = (time.perf_counter(), time.process_time())
        t_epoch.append(now[0] - t_last[0])
        c_epoch.append(now[1] - t_last[1])
        t_last[:] = now
        eta = np.mean(t_epoch) * (cfg.epochs - epoch)
        v = "" if val is None else f", val {val:.4f}"
        print(
            f"    {name} epoch {epoch}: {t_epoch[-1]:6.1f} s wall, {c_epoch[-1]:6.1f} s CPU, train {loss:.4f}{v} "
            f"(at most {eta / 60:5.1f} min left)",
            flush=True,
        )

    t0, c0 = time.perf_counter(), time.process_time()
    fitted = fit_forecaster(series, n_train, cfg, on_epoch=progress)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    # on a shared machine wall time measures the neighbours too; with one torch thread on the CPU, CPU time is
    # what the fit takes alone. On a GPU the wall time is the figure.
    use_cpu = cfg.device == "cpu" and cfg.n_threads == 1
    alone = cpu if use_cpu else wall
    epochs = c_epoch if use_cpu else t_epoch
    per_epoch = float(np.median(epochs[1:] if len(epochs) > 1 else epochs))  # the first also builds windows
    per_window = per_epoch / fitted.n_windows
    mse, last, mean = test_mse(fitted, series, n_train)
    val = "-" if fitted.val_loss is None else f"{fitted.val_loss:.4f}"
    print(
        f"{name:<15s} device {cfg.device}{' bf16' if cfg.amp else ''}, {cfg.n_threads} thread(s): "
        f"{fitted.n_windows} windows/epoch, {per_epoch:7.2f} s/epoch ({per_window * 1e3:.3f} ms/window, "
        f"{'CPU' if use_cpu else 'wall'}), {fitted.epochs} epochs, fit {wall / 60:6.1f} min wall / "
        f"{cpu / 60:6.1f} min CPU; val {val}; test MSE {mse:.4f} (last bin {last:.4f}, mean {mean:.4f})",
        flush=True,
    )
    return per_window, alone


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--traces", default=os.environ.get("TVW_TRACE_DIR", str(ROOT.parent / "shared" / "traces"))
    )
    p.add_argument("--series", help="an .npz written by --save-series (instead of building from --traces)")
    p.add_argument("--save-series", help="write the VM series to this .npz")
    p.add_argument("--schedules", default="paper_epoch,paper_feasible")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--amp", choices=("off", "on", "both"), default="off", help="bfloat16 autocast (GPU)")
    p.add_argument("--paper-epochs", type=int, default=2, help="epochs timed of the paper's schedule")
    p.add_argument("--max-epochs", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=None, help="default: the paper's 128")
    p.add_argument(
        "--strides",
        default=None,
        help="window strides of the paper_feasible schedule, e.g. 4,6,12 (default: its own)",
    )
    a = p.parse_args()

    series = load_series(a)
    n_train = [int(TRAIN_FRAC * s.shape[1]) for s in series]
    lengths = np.array([s.shape[1] for s in series])
    print(
        f"{len(series)} VMs, {lengths.min()}-{lengths.max()} bins (median {int(np.median(lengths))}), first "
        f"{TRAIN_FRAC:.0%} of each trains; {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    base = {
        "paper_epoch": replace(paper_scale(), epochs=a.paper_epochs),
        "paper_feasible": replace(paper_feasible(), epochs=a.max_epochs),
        "stride1_es": replace(paper_feasible(), stride=1, epochs=a.max_epochs),
    }
    amps = {"off": [False], "on": [True], "both": [False, True]}[a.amp]
    per_window: dict[tuple[str, bool], tuple[float, float]] = {}
    runs = []
    for name in a.schedules.split(","):
        if name not in base:
            raise SystemExit(f"--schedules: unknown schedule {name!r}; known: {', '.join(base)}")
        if name == "paper_feasible":
            runs += [
                (
                    f"stride{s}_es" if int(s) != paper_feasible().stride else name,
                    replace(base[name], stride=int(s)),
                )
                for s in (a.strides or str(paper_feasible().stride)).split(",")
            ]
        else:
            runs.append((name, base[name]))
    for name, run_cfg in runs:
        for amp in amps:
            cfg = replace(run_cfg, n_threads=a.threads, device=a.device, amp=amp)
            if a.batch_size:
                cfg = replace(cfg, batch_size=a.batch_size)
            try:
                per_window[(name, amp)] = run_schedule(name, cfg, series, n_train, a)
            except RuntimeError as e:  # e.g. an op with no bfloat16 kernel on this device
                if not amp:
                    raise
                print(f"{name} bf16 on {a.device}: failed: {str(e).splitlines()[0]}", flush=True)
    for (name, amp), (per, wall) in per_window.items():
        tag = f"{name}{' bf16' if amp else ''} on {a.device}"
        if name == "paper_epoch":
            n_all = int(sum(max(nt - paper_scale().window, 0) for nt in n_train))
            fit_h = per * n_all * 100 / 3600
            print(
                f"{tag}: {n_all} windows x 100 epochs -> one global fit {fit_h:.1f} h; Table 1 at the paper "
                f"profile ({TABLE1_FITS} data-sized fits) {fit_h * TABLE1_FITS:,.0f} h"
            )
        else:
            print(
                f"{tag}: one global fit {wall / 3600:.2f} h (target 1 h: {'met' if wall <= 3600 else 'NOT met'}); "
                f"Table 1 at the paper profile ({TABLE1_FITS} data-sized fits) {wall * TABLE1_FITS / 3600:,.0f} h"
            )


if __name__ == "__main__":
    main()
