"""TVW-RL Algorithm 1 (ClassifyToEC, UpdateECLabels) with a trained EC classifier: a `sim.labelling.Labeller`.

How the simulator's observed usage becomes the classifier's input, and the train/serve skew that costs, is written
in `sim.labelling`'s docstring; this module is the classifier side (`sim/` names no `models/` module).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from models.ec_classifier import load_classifier
from models.forecaster import torch_threads
from sim.config import SimConfig
from sim.jobs import JOB_META_COLUMNS, JobBatch
from sim.labelling import AgeTableLabeller, EcPredictor


class ClassifierLabeller(AgeTableLabeller):
    """TVW-RL Algorithm 1 with a trained EC classifier: meta only for jobs not started, meta + observed usage for
    placed ones, as of every call (see the module docstring for how usage becomes classifier input); predicted once
    per job and age (`sim.labelling.AgeTableLabeller`), since nothing else enters a prediction."""

    def __init__(
        self,
        classifier: EcPredictor | str | Path,
        prefix_bins_per_step: int = 12,
        usage_scale: Sequence[float] = (1.0, 1.0),
        n_threads: int | None = 1,
    ) -> None:
        """classifier: a TrainedClassifier or the path of one saved with `TrainedClassifier.save`;
        prefix_bins_per_step: 5-minute bins per logical step (`SequenceConfig.step_bins`);
        usage_scale: (cpu, mem) multipliers the job-sequence builder applied to fractions before quantising;
        n_threads: torch intra-op threads while predicting (None = leave as is). The net is tiny: on 2 busy cores
        one thread predicted 1000 jobs in 0.26 ms, two threads in 29 ms."""
        if isinstance(classifier, str | Path):
            classifier = load_classifier(classifier)
        if prefix_bins_per_step < 1:
            raise ValueError(f"prefix_bins_per_step must be >= 1, got {prefix_bins_per_step}")
        scale = np.asarray(usage_scale, dtype=np.float64)
        if scale.shape != (2,) or not (scale > 0).all():
            raise ValueError(f"usage_scale must be two positive (cpu, mem) multipliers, got {usage_scale}")
        self.classifier = classifier
        self.prefix_bins = int(classifier.cfg.prefix_bins)
        self.prefix_bins_per_step = prefix_bins_per_step
        self.usage_scale = scale
        self.n_threads = n_threads
        self._threads = torch_threads
        super().__init__()

    def n_ages(self, jobs: JobBatch | None = None) -> int:
        """Distinct inputs a job can show by age: ages 0 .. ceil(m / bins per step), after which the classifier's
        m prefix bins are all observed and its prediction no longer changes (1 for a meta-only classifier)."""
        return -(-self.prefix_bins // self.prefix_bins_per_step) + 1 if self.prefix_bins > 0 else 1

    def predict_jobs(
        self, cfg: SimConfig, jobs: JobBatch, rows: np.ndarray, job_index: np.ndarray, n_observed: np.ndarray
    ) -> np.ndarray:
        """(n,) int64 labels of jobs (rows[i], job_index[i]) after n_observed[i] usage steps: one predict call."""
        meta = self.meta_inputs(jobs, rows, job_index)
        prefixes = (
            self.prefix_inputs(cfg, jobs, rows, job_index, n_observed) if self.prefix_bins > 0 else None
        )
        with self._threads(self.n_threads):
            return np.asarray(self.classifier.predict(meta, prefixes)).astype(np.int64)

    @staticmethod
    def meta_inputs(jobs: JobBatch, rows: np.ndarray, job_index: np.ndarray) -> np.ndarray:
        """(n, 4) float meta of the jobs in JOB_META_COLUMNS order; all NaN (the classifier imputes its
        training means) when the batch carries no meta, e.g. synthetic sequences."""
        if jobs.meta is None:
            return np.full((len(rows), len(JOB_META_COLUMNS)), np.nan)
        return jobs.meta[rows, job_index].astype(np.float64)

    def prefix_inputs(
        self, cfg: SimConfig, jobs: JobBatch, rows: np.ndarray, job_index: np.ndarray, n_observed: np.ndarray
    ) -> np.ndarray:
        """(n, 2, <= m) observed (cpu, mem) fractions per 5-minute bin: each step's units / C_d / usage_scale
        repeated prefix_bins_per_step times, NaN from bin n_observed * prefix_bins_per_step on."""
        if cfg.n_resources != 2:
            raise ValueError(
                f"the EC classifier reads (cpu, mem) usage; the config has {cfg.n_resources} resources"
            )
        k = self.prefix_bins_per_step
        n_steps = min(-(-self.prefix_bins // k), jobs.max_duration)
        cap = np.asarray(cfg.capacity_units, dtype=np.float64)
        frac = jobs.usage[rows, job_index, :n_steps] / (cap * self.usage_scale)  # (n, steps, 2)
        bins = np.repeat(frac, k, axis=1)[:, : self.prefix_bins]  # (n, bins, 2)
        is_known = np.arange(bins.shape[1])[None, :] < (np.asarray(n_observed) * k)[:, None]
        return np.where(is_known[..., None], bins, np.nan).transpose(0, 2, 1)


def classifier_labellers(
    path_of: Callable[[str], Path], usage_scale: pl.DataFrame
) -> Callable[[str], ClassifierLabeller | None]:
    """source -> TVW-RL Algorithm 1's labeller of a real source, built once: its saved EC classifier
    (`path_of(source)`) with the sequences' usage scale and step (`sim__usage_scale` rows: source, cpu scale,
    mem scale, bins per step); None where there is none (synthetic sources, no classifier saved)."""

    @functools.cache
    def labeller(source: str) -> ClassifierLabeller | None:
        path, row = Path(path_of(source)), usage_scale.filter(pl.col("source") == source)
        if not path.exists() or row.height == 0:
            return None
        _, cpu_scale, mem_scale, step_bins = row.row(0)
        return ClassifierLabeller(path, prefix_bins_per_step=step_bins, usage_scale=(cpu_scale, mem_scale))

    return labeller
