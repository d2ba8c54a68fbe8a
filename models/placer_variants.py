"""Training the variants of one (source, load, seed) of the forecast residual scheduler: one after another,
or at once in worker processes, one per core.

A run trains several variants on the same fit and validation sequences (without and with an advisor:
`PlacerTrainConfig.advisor_choice`, bench_placer's `--advisor none,...`) and publishes the one validation
prefers (`models.forecast_placer.choose_variant`). The variants share nothing while they train, so on a machine
with as many cores as variants they can train side by side: the wall time of the longest instead of the sum of
all. That is what lets both variants of the adopted configuration have the issue's 3 minutes each on the 2-core
machine instead of 85 s each (benchmarks/RESULTS.md, "Both variants at once").

Workers are spawned processes (not forked: torch's and numba's thread pools are not safe across a fork), each
on one torch thread and `granted cores // workers` numba threads: at most as many workers as the cores this
process is granted (`granted_cores`), and none in a daemonic process (`may_start_processes`; `tvw-run`'s run
workers are not daemonic since the twenty-first session); the variants then train in turn and the log says why. Every random number of a run
comes from its `PlacerConfig.seed` and the network's bits do not depend on the thread count, so a variant
trained in a worker returns the same policy and stage table as one trained in the caller (a test checks it);
only the seconds differ. Log lines of a worker reach the caller's `log` as they come, prefixed with the
variant's label. A worker's exception is raised in the caller with its type, its message, the variant's label
and the worker's traceback as notes; a worker that dies without a result (killed, out of memory) is a
RuntimeError naming the variant and its exit code.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import polars as pl

from models.forecast_placer import ForecastResidualPolicy, PlacerConfig, train_forecast_placer
from sim.config import SimConfig
from sim.jobs import JobBatch

__all__ = ["Variant", "train_variants", "usable_cores"]


@dataclass(frozen=True)
class Variant:
    """One training run of a (source, load, seed): its label (log lines, results), its PlacerConfig and its
    fitted advisor (None: no advisor)."""

    label: str
    config: PlacerConfig
    advisor: object | None = None


Trained = tuple[ForecastResidualPolicy, pl.DataFrame, dict]
"""(the policy at its kept iteration, its stage table, the speed figures `train_forecast_placer` filled)."""


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity where the platform says, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def may_start_processes() -> bool:
    """Whether this process may start worker processes: a daemonic one may not (multiprocessing refuses it
    children; `tvw-run`'s run workers are not daemonic, `cli.workers`)."""
    return not mp.current_process().daemon


def granted_cores() -> int:
    """Cores this process's work is granted: those it may run on, at most numba's thread count, which is how
    `tvw-run` gives each of its `--jobs` runs at once its share (NUMBA_NUM_THREADS and the other thread
    variables, `cli.workers.THREAD_ENV`) and how a user grants a benchmark its cores."""
    import numba

    return max(1, min(usable_cores(), numba.config.NUMBA_NUM_THREADS))


def train_variants(
    sim_cfg: SimConfig,
    train: JobBatch,
    base,
    forecaster,
    variants: list[Variant],
    workers: int = 1,
    log: Callable[[str], None] | None = None,
    device: str = "cpu",
    labeller=None,
) -> dict[str, Trained]:
    """{label: (policy, stage table, speed)} of every variant, trained by `train_forecast_placer` on the same
    `train`, `base`, `forecaster` and `labeller`: in this process one after another where `workers` is 1 or there
    is one variant, or, said in the log, where this process is granted one core (`granted_cores`) or may start
    no process (`may_start_processes`); else in min(workers, variants, granted cores) spawned processes at once
    (module docstring). The results are the same either way; the order of the dict is the order of `variants`.
    ValueError on bad arguments (no variants, a label twice, workers < 1)."""
    if not variants:
        raise ValueError("train_variants: no variants to train")
    labels = [v.label for v in variants]
    if len(set(labels)) != len(labels):
        raise ValueError(f"train_variants: every variant needs its own label, got {labels}")
    if not (isinstance(workers, int) and workers >= 1):
        raise ValueError(f"train_variants: workers must be an integer >= 1, got {workers!r}")
    say = log or (lambda msg: None)
    shared = (sim_cfg, train, base, forecaster, device, labeller)
    if workers == 1 or len(variants) == 1:
        return {
            v.label: _train(
                shared, v, say if len(variants) == 1 else lambda m, lab=v.label: say(f"{lab}: {m}")
            )
            for v in variants
        }
    cores = granted_cores()
    n_workers = min(workers, len(variants), cores)
    why = None
    if n_workers == 1:
        why = f"this process is granted 1 core (NUMBA_NUM_THREADS), not {workers}"
    elif not may_start_processes():
        why = "this is a daemonic process, which may start none"
    if why is not None:
        say(f"training the variants in turn: {why}")
        return train_variants(sim_cfg, train, base, forecaster, variants, 1, log, device, labeller)
    threads = max(1, cores // n_workers)
    return _train_in_workers(shared, variants, n_workers, threads, say)


def _train(shared, variant: Variant, log: Callable[[str], None]) -> Trained:
    """One variant by `train_forecast_placer` on the run's shared (sim_cfg, train, base, forecaster, device,
    labeller)."""
    sim_cfg, train, base, forecaster, device, labeller = shared
    speed: dict = {}
    policy, table = train_forecast_placer(
        sim_cfg,
        train,
        base,
        forecaster,
        variant.config,
        log=log,
        speed=speed,
        device=device,
        labeller=labeller,
        advisor=variant.advisor,
    )
    return policy, table, speed


def _train_in_workers(shared, variants, n_workers, threads, say) -> dict[str, Trained]:
    ctx = mp.get_context("spawn")
    messages = ctx.Queue()
    pending = list(variants)
    running: dict[str, mp.process.BaseProcess] = {}
    results: dict[str, Trained] = {}
    started = time.perf_counter()
    try:
        while pending or running:
            while pending and len(running) < n_workers:
                v = pending.pop(0)
                proc = ctx.Process(
                    target=_train_one,
                    args=(shared, v, threads, messages),
                    name=f"tvw-variant-{v.label}",
                    daemon=True,
                )
                proc.start()
                running[v.label] = proc
            try:
                kind, label, value = messages.get(timeout=1.0)
            except queue.Empty:
                _check_alive(running, messages, results, say)
                continue
            _receive(kind, label, value, running, results, say)
    finally:
        for proc in running.values():  # only after a failure: the others are stopped, not waited for
            proc.terminate()
        for proc in running.values():
            proc.join(timeout=10)
        messages.close()
    say(f"{len(variants)} variants trained in {time.perf_counter() - started:.1f} s on {n_workers} workers")
    return {v.label: results[v.label] for v in variants}


def _receive(kind: str, label: str, value, running: dict, results: dict, say) -> None:
    if kind == "log":
        say(f"{label}: {value}")
    elif kind == "done":
        results[label] = pickle.loads(value)
        running.pop(label).join()
    else:  # "error": the worker's exception, its traceback text as a note
        running.pop(label).join()
        raise pickle.loads(value)


def _check_alive(running: dict, messages, results: dict, say) -> None:
    """A worker that exited without sending its result: read what it may still have sent, then fail by name."""
    for label, proc in list(running.items()):
        if proc.exitcode is None:
            continue
        try:  # its last messages may be on their way: the result is put before the process exits
            while label in running:
                kind, got, value = messages.get(timeout=5.0)
                _receive(kind, got, value, running, results, say)
        except queue.Empty:
            pass
        if label in running:
            running.pop(label)
            raise RuntimeError(
                f"train_variants: the worker training variant {label!r} exited with code {proc.exitcode} "
                "without a result (killed or out of memory?)"
            )


def _train_one(shared, variant: Variant, threads: int, messages) -> None:
    """Worker: train one variant and send ("log", label, line)s, then ("done", label, pickled result) or ("error",
    label, pickled exception)."""
    import numba
    import torch

    torch.set_num_threads(1)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    label = variant.label
    try:
        result = _train(shared, variant, lambda m: messages.put(("log", label, m)))
        sent = ("done", label, pickle.dumps(result))  # here, so a failure to pickle is caught
    except BaseException as exc:  # noqa: BLE001 - every failure goes back to the caller, by name
        exc.add_note(f"in the worker training variant {label!r}:\n{traceback.format_exc()}")
        try:
            sent = ("error", label, pickle.dumps(exc))
        except Exception:  # an exception that does not pickle: its type, text and notes
            notes = "\n".join(exc.__notes__)
            sent = ("error", label, pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}\n{notes}")))
    messages.put(sent)
    messages.close()
    messages.join_thread()
