"""An EC labeller trained and served on the simulator's view of a job (issue 22, item 2).

`models.ec_labeller.ClassifierLabeller` feeds a classifier trained on the first m 5-minute bins of each workload from
its start, at full resolution, with what the simulator has: ceil-quantised step units of a job cut at a random
offset into its workload's run. Measured on the sample's test sequences (30-minute steps; accuracy of the saved
classifier with 2 or more steps observed, fed the same windows four ways): Bitbrains 0.12 from the simulator's
view, 0.45 from the unquantised step means, 0.55 from the 5-minute bins, 0.89 from the workloads' first bins (the
view it was trained on, in-sample: it was trained on every workload); Google-derived 0.47, 0.58, 0.58, 0.61.
Quantisation is the largest loss; the offset matters on Bitbrains. `SimViewLabeller` removes the skew by
construction:

- its examples are the jobs of the TRAINING job sequences (`sim__job_sequences`, split "train"): windows cut at
  random offsets, quantised and time-scaled exactly as the simulator shows them, labelled with their workload's
  clustering label (`ec_label`);
- each job is seen at age 0 (meta only) and at `n_ages_per_job` random observed lengths (log-uniform on
  1..duration, so young jobs, where labels matter most, are not swamped by old ones);
- its inputs come from ONE function, `job_features`, of `sim.forecast.job_view` (the one place that reads a job's
  observed usage, and only the observed steps) plus the job's meta, at fit time and at serve time alike.

Usage finer than one unit of C_d: `JobBatch.usage` holds ceil-quantised units only, but `sim__job_sequences`
carries the unquantised step means beside them (`cpu_units_exact` / `mem_units_exact`, float units of C_d), which
`JobBatch.usage_exact` holds and `job_view` shows through the same observed-steps mask (`recent_exact`,
`life_mean_exact`, `life_max_exact`). `SimLabellerConfig.usage_view` picks the view: "exact" reads them, "units" the
quantised units, "auto" (the default) the exact view whenever the training batch has it. The fitted labeller
records its view (`SimViewLabeller.view`) and refuses, with a ValueError naming it, to serve a batch without it;
`job_features` takes the view, so fit and serve build their inputs in one function alike. Only the labeller reads
the unquantised usage; the simulator's step logic stays on the integer units.
Measured on the sample's test sequences (`benchmarks/bench_sim_labeller.py`, 30-minute steps, mean of 5 fits; best
constant label beside): Bitbrains 0.50 / 0.53 / 0.55 / 0.55 quantised vs 0.49 / 0.52 / 0.55 / 0.55 exact at ages
1 / 2 / 8 / 16 (constant 0.17); Google-derived 0.39 / 0.38 / 0.43 / 0.43 vs 0.35 / 0.34 / 0.44 / 0.49 (constant
0.26). With this model and features the exact view is no gain on Bitbrains and helps older Google jobs only; the
test splits are a handful of workloads (Bitbrains 11), so these are rough.

Ages count as TVW-RL's classifier labeller counts them (`sim.labelling.observed_steps`): a job started at s is
labelled at step t from its steps s .. t - 1, a job in the queue or placed at the current step from its meta only.
So a label depends only on the job and that count: each (job, age) is predicted once and kept
(`sim.labelling.AgeTableLabeller`), and the same predictions are what the fitted rules' label-keyed tables are
trained on (`sim.labelling.labels_by_age`): the rules are trained and served on one view. (Until 2026-11-27 it
also read the current step, as `job_view` shows it; the step before is what a label table can serve exactly.) The model is a
multinomial logistic regression (fitted with sklearn, applied in numpy: one small matrix product).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from threadpoolctl import ThreadpoolController

from pipelines.progress import Progress
from pipelines.synthetic import is_synthetic
from sim.config import SimConfig
from sim.core import State
from sim.forecast import JobView, job_view
from sim.jobs import JobBatch
from sim.labelling import (
    LABEL_ACCURACY,
    AgeLabeller,
    AgeTableLabeller,
    array_digest,
    label_accuracy_by_age,
    most_frequent_label,
)


@dataclass(frozen=True)
class SimLabellerConfig:
    """How `SimViewLabeller` is fitted: the examples drawn from training jobs and the model's size."""

    n_recent: int = 24
    """R: last observed steps the window features read (level, spread, trend); whole-life mean and max come
    from `job_view` too."""
    n_ages_per_job: int = 4
    """Random observed lengths per training job, besides age 0 (meta only)."""
    inverse_regularisation: float = 1.0
    """C of the multinomial logistic regression (smaller = stronger L2 penalty)."""
    max_iter: int = 2000
    """L-BFGS iterations at most while fitting."""
    seed: int = 0
    """Seeds the sampled ages."""
    n_threads: int | None = 1
    """BLAS/OpenMP threads while fitting (None = leave as is); prediction is one small matrix product."""
    usage_view: str = "auto"
    """Which usage the features read (`USAGE_VIEWS`): "exact" = the unquantised step means
    (`JobBatch.usage_exact`; fitting on a batch without them is an error), "units" = the quantised units the
    simulator steps on, "auto" = "exact" when the training batch has it, else "units"."""


USAGE_VIEWS = ("auto", "exact", "units")
"""Values of `SimLabellerConfig.usage_view`; a fitted labeller's `view` is "exact" or "units"."""


FEATURE_NAMES = (
    "cpu_request_frac",
    "mem_request_frac",
    "priority",
    "scheduling_class",
    "log1p_steps_observed",
    "cpu_life_mean",
    "mem_life_mean",
    "cpu_life_max",
    "mem_life_max",
    "cpu_last",
    "mem_last",
    "cpu_recent_mean",
    "mem_recent_mean",
    "cpu_recent_std",
    "mem_recent_std",
    "cpu_recent_min",
    "mem_recent_min",
    "cpu_recent_mean_abs_diff",
    "mem_recent_mean_abs_diff",
    "cpu_recent_trend",
    "mem_recent_trend",
    "cpu_recent_frac_at_min_unit",
    "mem_recent_frac_at_min_unit",
    "cpu_mem_ratio",
)
"""Columns of `job_features`; usage in fractions of a machine (units / C_d), NaN where nothing is observed."""


def observed_usage(view: JobView, usage_view: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(recent, life_mean, life_max) of `view` in units of C_d: the quantised units ("units") or the unquantised
    step means ("exact"). ValueError naming the view when the view has no unquantised usage."""
    if usage_view == "units":
        return view.recent, view.life_mean, view.life_max
    if usage_view != "exact":
        raise ValueError(f"usage view must be 'exact' or 'units', got {usage_view!r}")
    if view.recent_exact is None or view.life_mean_exact is None or view.life_max_exact is None:
        raise ValueError(
            "this labeller reads the 'exact' usage view (unquantised step means, JobBatch.usage_exact) but the "
            "batch has none (sim__job_sequences without cpu_units_exact / mem_units_exact?); refit it with "
            "usage_view='units' or rebuild the sequences"
        )
    return view.recent_exact, view.life_mean_exact, view.life_max_exact


def job_features(view: JobView, usage_view: str = "units") -> np.ndarray:
    """(N, len(FEATURE_NAMES)) float64 inputs of the labeller: the job's meta and summaries of its observed usage
    (`view.recent`, `view.life_mean`, `view.life_max`, or their unquantised twins with usage_view="exact"; all
    from `job_view`, hence observed steps only), in fractions of a machine. NaN where a value is unknown (no usage
    observed, missing meta); the model reads it through its imputation and is_missing inputs. The label in the
    view is never read. ValueError when usage_view="exact" and the view has no unquantised usage."""
    recent_units, life_mean, life_max = observed_usage(view, usage_view)
    cap = view.capacity.astype(np.float64)
    # (N, D, R) with the steps last, so every summary is a contiguous masked sum (nan-functions are 5x slower)
    recent = np.ascontiguousarray(np.moveaxis(recent_units, 1, 2)) / cap[:, None]
    is_seen = np.isfinite(recent)
    zero = np.where(is_seen, recent, 0.0)
    steps = np.diff(recent, axis=2)
    has_step = np.isfinite(steps)
    with np.errstate(all="ignore"):  # 0 / 0 = NaN: nothing observed (or one step only, for the diffs)
        n_seen = is_seen.sum(axis=2)  # (N, D)
        recent_mean = zero.sum(axis=2) / n_seen
        recent_std = np.sqrt(np.maximum((zero * zero).sum(axis=2) / n_seen - recent_mean**2, 0.0))
        recent_min = np.where(is_seen, recent, np.inf).min(axis=2)
        recent_min[n_seen == 0] = np.nan
        abs_diff = np.where(has_step, np.abs(steps), 0.0).sum(axis=2) / has_step.sum(axis=2)
        last = recent[:, :, -1]
        first_seen = recent[np.arange(view.size)[:, None], np.arange(recent.shape[1]), -n_seen.clip(1)]
        trend = last - first_seen
        at_min_unit = (is_seen & (recent <= 1.0 / cap[:, None] + 1e-9)).sum(axis=2) / n_seen
        ratio = np.log((life_mean[:, 0] + 0.5) / (life_mean[:, 1] + 0.5))
    return np.column_stack(
        [
            view.meta,
            np.log1p(view.n_observed),
            life_mean / cap,
            life_max / cap,
            last,
            recent_mean,
            recent_std,
            recent_min,
            abs_diff,
            trend,
            at_min_unit,
            ratio,
        ]
    )


SHARED_SUMMARIES_MAX_VALUES = 4_000_000
"""Largest batch (B x J x T x D usage values) whose running summaries `state_at_ages` computes to share them
(14 bytes per value and usage view: at most 56 MB, 112 MB with the unquantised view; an evaluation batch of 30
DeepPlace 80 % sequences has 2.5 M)."""


def state_at_ages(jobs: JobBatch, rows: np.ndarray, job_index: np.ndarray, n_observed: np.ndarray) -> State:
    """A simulator state of N one-job envs: env i holds job (rows[i], job_index[i]) of `jobs` with n_observed[i]
    usage steps observed (0 = waiting, not placed), in `job_view`'s convention. Only what `job_view` reads is
    filled; labels are blanked (0), so nothing built from it can read the clustering label."""
    rows, job_index = np.asarray(rows, dtype=np.int64), np.asarray(job_index, dtype=np.int64)
    n_obs = np.asarray(n_observed, dtype=np.int64)
    n = rows.size
    n_d = jobs.n_resources
    one = JobBatch(
        arrival_step=np.zeros((n, 1), dtype=np.int64),
        duration=jobs.duration[rows, job_index][:, None],
        usage=jobs.usage[rows, job_index][:, None],
        request=jobs.request[rows, job_index][:, None],
        ec_label=np.zeros((n, 1), dtype=np.int64),
        n_jobs=np.ones(n, dtype=np.int64),
        meta=None if jobs.meta is None else jobs.meta[rows, job_index][:, None],
        usage_exact=None if jobs.usage_exact is None else jobs.usage_exact[rows, job_index][:, None],
    )
    # the batch's running summaries, shared: a rollout asks for a few jobs at each decision, and summaries of
    # those alone cost more over an episode than the whole batch's once; computed for the batch here only up to
    # SHARED_SUMMARIES_MAX_VALUES usage values (a larger batch, e.g. a training rollout's, keeps the selection's)
    jobs.lend_summaries(one, rows, job_index, SHARED_SUMMARIES_MAX_VALUES)
    t = np.full(n, jobs.max_duration, dtype=np.int64)
    is_placed = n_obs > 0
    return State(
        jobs=one,
        t=t,
        next_job=is_placed.astype(np.int64),
        n_arrived=np.ones(n, dtype=np.int64),
        timeline=np.zeros((n, 1, 1, n_d), dtype=np.int32),
        overlap=np.zeros((n, 1), dtype=np.int64),
        past=np.zeros((n, 1, 1, n_d), dtype=np.float32),
        busy_until=np.zeros((n, 1), dtype=np.int64),
        job_machine=np.where(is_placed, 0, -1)[:, None],
        job_start=np.where(is_placed, t - n_obs + 1, -1)[:, None],
        has_overshot=np.zeros((n, 1, n_d), dtype=bool),
        noise=None,
        is_terminated=np.zeros(n, dtype=bool),
        is_truncated=np.zeros(n, dtype=bool),
        penalty_totals=np.zeros((n, 5), dtype=np.float64),
        n_clipped=np.zeros(n, dtype=np.int64),
        obs_label=np.zeros((n, 1), dtype=np.int64),
    )


def features_at_ages(
    cfg: SimConfig,
    jobs: JobBatch,
    rows: np.ndarray,
    job_index: np.ndarray,
    n_observed: np.ndarray,
    n_recent: int,
    usage_view: str = "units",
) -> np.ndarray:
    """`job_features` (of `usage_view`) of jobs (rows[i], job_index[i]) after n_observed[i] steps: the view a
    rollout would give."""
    state = state_at_ages(jobs, rows, job_index, n_observed)
    env = np.arange(state.batch_size)
    return job_features(job_view(cfg, state, env, np.zeros_like(env), n_recent), usage_view)


def sample_ages(duration: np.ndarray, n_ages: int, rng: np.random.Generator) -> np.ndarray:
    """(N, n_ages + 1) ages per job: 0, then n_ages draws log-uniform on 1..duration (integers)."""
    duration = np.asarray(duration, dtype=np.int64)
    u = rng.random((duration.size, n_ages))
    ages = np.floor(np.exp(u * np.log(duration[:, None] + 1.0))).astype(np.int64)  # 1 .. duration
    return np.column_stack([np.zeros(duration.size, dtype=np.int64), ages.clip(1, duration[:, None])])


@dataclass(frozen=True)
class LinearModel:
    """Multinomial logistic regression on `job_features`, applied in numpy: missing values take their training
    mean and set an is_missing column (for the features that were ever missing in training), every column is
    standardised with training stats, then logits = z @ coef.T + intercept."""

    fill: np.ndarray
    """(F,) training mean of each feature (0 for one never known in training)."""
    flagged: np.ndarray
    """(F_m,) int indices of the features that get an is_missing column."""
    mean: np.ndarray
    """(F + F_m,) training mean of each model input."""
    std: np.ndarray
    """(F + F_m,) training standard deviation of each model input (1 where it is 0)."""
    coef: np.ndarray
    """(K, F + F_m) weights per class (K = 2 classes: one row, the second class's logit)."""
    intercept: np.ndarray
    """(K,) biases."""

    def inputs(self, x: np.ndarray) -> np.ndarray:
        """(N, F + F_m) standardised model inputs of `job_features` rows."""
        is_missing = np.isnan(x)
        raw = np.concatenate([np.where(is_missing, self.fill, x), is_missing[:, self.flagged]], axis=1)
        return (raw - self.mean) / self.std

    def predict(self, x: np.ndarray) -> np.ndarray:
        """(N,) int64 class index per row."""
        logits = self.inputs(x) @ self.coef.T + self.intercept
        if logits.shape[1] == 1:  # binary: one logit, for class 1
            return (logits[:, 0] > 0).astype(np.int64)
        return logits.argmax(axis=1)


class SimViewLabeller(AgeTableLabeller):
    """EC labels from meta plus the usage observed so far, as the simulator shows it (`sim.labelling.Labeller`).

    Fit with `fit_sim_labeller`. Like TVW-RL's classifier labeller it labels a job from the steps before the
    current one (`sim.labelling.observed_steps`: meta only in the queue and at the step it is placed), so a job's
    label depends only on the job and that count: `labels(cfg, state)` and `label_table` read labels predicted
    once per (job, age) by `predict_jobs` (`sim.labelling.AgeTableLabeller`), the one function fitting uses too,
    so the tables the fitted rules are trained on (`sim.labelling.labels_by_age`) are the labels it serves.
    Both read the usage view it was trained on (`view`) and raise ValueError naming it on a batch without it."""

    def __init__(
        self, model: LinearModel, classes: np.ndarray, cfg: SimLabellerConfig, view: str = "units"
    ) -> None:
        """model: fitted on `job_features` rows of usage view `view` ("exact" or "units"); classes: the EC label
        of each model class."""
        if view not in ("exact", "units"):
            raise ValueError(f"SimViewLabeller: view must be 'exact' or 'units', got {view!r}")
        super().__init__()
        self.model = model
        self.classes = np.asarray(classes, dtype=np.int64)
        self.cfg = cfg
        self.view = view

    def n_ages(self, jobs: JobBatch) -> int:
        """Ages 0 .. the longest job of `jobs`: every observed length can change the prediction."""
        return int(jobs.max_duration) + 1

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        """(N,) int64 labels from `job_features` rows."""
        return self.classes[self.model.predict(x)]

    def labels(self, cfg: SimConfig, state: State) -> np.ndarray:
        self.check_batch(state.jobs)
        return super().labels(cfg, state)

    def save(self, path: Path, card: dict | None = None) -> None:
        """Write the model, classes, config and view to `path` (.npz; `load_sim_labeller` reads it back), with a
        `card` of what it was trained on."""
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {
            "format": SAVE_FORMAT,
            "view": self.view,
            "config": dataclasses.asdict(self.cfg),
            "card": card,
        }
        arrays = {name: getattr(self.model, name) for name in LINEAR_FIELDS}
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as fh:
            np.savez(fh, header=np.array(json.dumps(header)), classes=self.classes, **arrays)
        tmp.replace(path)

    def fingerprint(self) -> str:
        """A hex digest of what the labels depend on (the model, classes, config and view: what `save` writes);
        `sim.tuning.FitContext` keys remembered validation choices by it."""
        parts = [self.classes, *(getattr(self.model, name) for name in LINEAR_FIELDS)]
        return array_digest(parts, json.dumps([self.view, dataclasses.asdict(self.cfg)]).encode()).hex()

    def predict_jobs(
        self, cfg: SimConfig, jobs: JobBatch, rows: np.ndarray, job_index: np.ndarray, n_observed: np.ndarray
    ) -> np.ndarray:
        """(n,) int64 labels of jobs (rows[i], job_index[i]) after n_observed[i] usage steps."""
        self.check_batch(jobs)
        x = features_at_ages(cfg, jobs, rows, job_index, n_observed, self.cfg.n_recent, self.view)
        return self.predict_features(x)

    def check_batch(self, jobs: JobBatch) -> None:
        """ValueError, naming the view, when this labeller reads the "exact" view and `jobs` has no
        unquantised usage (it would otherwise be served inputs it was never trained on)."""
        if self.view == "exact" and jobs.usage_exact is None:
            raise ValueError(
                "SimViewLabeller was trained on the 'exact' usage view (unquantised step means) but this job "
                "batch has no usage_exact (sim__job_sequences without cpu_units_exact / mem_units_exact); "
                "serve it sequences that carry them, or fit one with usage_view='units'"
            )


SAVE_FORMAT = "tvw.sim_view_labeller.v1"
LINEAR_FIELDS = ("fill", "flagged", "mean", "std", "coef", "intercept")


def load_sim_labeller(path: Path) -> SimViewLabeller:
    """The labeller `SimViewLabeller.save` wrote at `path`; ValueError naming the file when it is not one."""
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            if header.get("format") != SAVE_FORMAT:
                raise ValueError(f"format {header.get('format')!r}, expected {SAVE_FORMAT!r}")
            model = LinearModel(**{name: data[name] for name in LINEAR_FIELDS})
            classes = data["classes"]
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a saved SimViewLabeller ({exc})") from exc
    return SimViewLabeller(model, classes, SimLabellerConfig(**header["config"]), header["view"])


def sim_view_path(saved_classifier: Path) -> Path:
    """Where the pipeline saves the simulator-view labeller it serves for the source whose EC classifier is saved
    at `saved_classifier` ('ec_classifier__<source>.pt' -> 'ec_sim_view__<source>.npz', beside it)."""
    saved = Path(saved_classifier)
    return saved.with_name(saved.name.replace("ec_classifier__", "ec_sim_view__", 1)).with_suffix(".npz")


def fit_source_labeller(
    sequences: pl.DataFrame, source: str, config: SimLabellerConfig, n_labels: int = 16
) -> tuple[SimViewLabeller | None, SimConfig, int]:
    """(labeller, simulator config, training jobs) of `source`: a `SimViewLabeller` fitted on the jobs of its
    TRAINING sequences of `sequences` (`sim__job_sequences` rows, every load; cut from training workload groups
    only, so no test workload is seen), on a simulator whose label count covers every job of the source. None
    when the training jobs hold fewer than 2 labels."""
    rows = sequences.filter(pl.col("source") == source)
    train = rows.filter(pl.col("split") == "train")
    top = int(rows["ec_label"].max() or 0) if rows.height else 0
    cfg = SimConfig(n_labels=max(n_labels, top + 1), oversize="clip")
    if train.height == 0 or train["ec_label"].n_unique() < 2:  # checked on the rows: no batch built for none
        return None, cfg, train.height
    return fit_sim_labeller(cfg, JobBatch.from_frame(train), config), cfg, train.height


def fit_labeller_if_labelled(
    cfg: SimConfig, train_jobs: JobBatch, config: SimLabellerConfig
) -> SimViewLabeller | None:
    """`fit_sim_labeller` on training jobs already in a batch, or None where its real jobs (not the padding) hold
    fewer than 2 EC labels, as `fit_source_labeller` decides on the rows (a source whose EC stage chose no
    mapping, e.g. the shared trace's 84 Bitbrains VMs): there is no label to serve."""
    real = train_jobs.is_real
    if np.unique(train_jobs.ec_label[real]).size < 2:
        return None
    return fit_sim_labeller(cfg, train_jobs, config)


def fit_sim_labeller(cfg: SimConfig, train_jobs: JobBatch, config: SimLabellerConfig) -> SimViewLabeller:
    """Fit a `SimViewLabeller` on every real job of `train_jobs` (the TRAINING sequences: their `ec_label` is
    their workload's clustering label), each at age 0 and at `config.n_ages_per_job` random observed lengths, on
    the usage view `resolve_usage_view` picks. ValueError when the jobs hold fewer than two labels, or when the
    "exact" view is asked of jobs without unquantised usage."""
    view = resolve_usage_view(config.usage_view, train_jobs)
    rows, job_index = np.nonzero(train_jobs.is_real)
    y = train_jobs.ec_label[rows, job_index]
    classes, y_idx = np.unique(y, return_inverse=True)
    if classes.size < 2:
        raise ValueError(f"fit_sim_labeller: training jobs hold {classes.size} EC label(s); need at least 2")
    rng = np.random.default_rng(config.seed)
    ages = sample_ages(train_jobs.duration[rows, job_index], config.n_ages_per_job, rng)
    x = np.concatenate(
        [features_at_ages(cfg, train_jobs, rows, job_index, a, config.n_recent, view) for a in ages.T]
    )
    return SimViewLabeller(_fit_linear(x, np.tile(y_idx, ages.shape[1]), config), classes, config, view)


def resolve_usage_view(usage_view: str, jobs: JobBatch) -> str:
    """The view ("exact" or "units") a labeller fitted on `jobs` with `SimLabellerConfig.usage_view` reads."""
    if usage_view not in USAGE_VIEWS:
        raise ValueError(f"usage_view must be one of {USAGE_VIEWS}, got {usage_view!r}")
    if usage_view == "auto":
        return "exact" if jobs.usage_exact is not None else "units"
    if usage_view == "exact" and jobs.usage_exact is None:
        raise ValueError(
            "fit_sim_labeller: usage_view='exact' but the training jobs have no unquantised usage "
            "(sim__job_sequences without cpu_units_exact / mem_units_exact)"
        )
    return usage_view


def _fit_linear(x: np.ndarray, y: np.ndarray, config: SimLabellerConfig) -> LinearModel:
    """Imputation and standardisation stats from `x`, then L2-penalised multinomial logistic regression."""
    is_missing = np.isnan(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a feature never known in training: mean of nothing
        fill = np.nan_to_num(np.nanmean(x, axis=0), nan=0.0)
    flagged = np.flatnonzero(is_missing.any(axis=0) & ~is_missing.all(axis=0))
    raw = np.concatenate([np.where(is_missing, fill, x), is_missing[:, flagged]], axis=1)
    mean, std = raw.mean(axis=0), raw.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    fit = LogisticRegression(C=config.inverse_regularisation, max_iter=config.max_iter)
    with _limited(config.n_threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter is the budget; the fit is used as is
        fit.fit((raw - mean) / std, y)
    return LinearModel(fill, flagged, mean, std, fit.coef_.copy(), fit.intercept_.copy())


def _limited(n_threads: int | None):
    """Context that caps BLAS/OpenMP threads at n_threads (None: a no-op). On 2 busy cores, unlimited threads
    made sklearn fits and predictions 10-40x slower."""
    if n_threads is None:
        return contextlib.nullcontext()
    return ThreadpoolController().limit(limits=n_threads)


# --- labelling accuracy of the test sequences (`eval__ec_labelling`) -----------------------------------------


@dataclass(frozen=True)
class LabellingSettings:
    """How labellers are scored on the test sequences' jobs by age (`labelling_accuracy`)."""

    ages_steps: tuple[int, ...] = (0, 1, 2, 4, 8, 16)
    """Job ages (steps observed) to score."""
    n_labels: int = 16
    """G: labels the simulator accepts (raised to cover every label of a source's jobs)."""
    sim_view: SimLabellerConfig = field(default_factory=SimLabellerConfig)
    """How the `sim_view` labeller is fitted on each source's training sequences."""


ClassifierFor = Callable[[str], AgeLabeller | None]
"""source -> its serving EC classifier as a labeller, built with the sequences' usage scale and step
(`assets.ec.labellers`, `models.ec_labeller.classifier_labellers`), or None where the source has none."""


def labelling_accuracy(
    sequences: pl.DataFrame,
    usage_scale: pl.DataFrame,
    settings: LabellingSettings,
    classifier_for: ClassifierFor | None = None,
    log: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> pl.DataFrame:
    """LABEL_ACCURACY rows per (source, load, labeller) of the test jobs of `sequences` (`sim__job_sequences`), for
    every source of `usage_scale` (`sim__usage_scale`): `sim_view` fitted on the source's training jobs (when they
    hold 2 labels or more) and the serving EC classifier (`classifier_for`), each beside the best constant label (the
    most frequent EC of the training jobs). A source with neither labeller is skipped (`warn` says why)."""
    say = warn or (lambda msg: None)
    key = {"source": pl.String, "load_pct": pl.Int32, "labeller": pl.String}
    frames = []
    test_all = sequences.filter(pl.col("split") == "test")
    train_all = sequences.filter(pl.col("split") == "train")
    n_groups = test_all.join(usage_scale.select("source"), on="source").select("source", "load_pct").unique()
    progress = Progress(n_groups.height, "EC labelling", log=log, unit="groups")
    for source in usage_scale["source"].to_list():
        test = test_all.filter(pl.col("source") == source)
        train = train_all.filter(pl.col("source") == source)
        sim_view, cfg, _ = fit_source_labeller(
            pl.concat([train, test]), source, settings.sim_view, settings.n_labels
        )
        labellers = {}
        if sim_view is not None:
            labellers["sim_view"] = sim_view
        else:
            say(f"{source}: training jobs hold fewer than 2 EC labels; no sim_view labeller")
        classifier = classifier_for(source) if classifier_for else None
        if classifier is not None:
            labellers["classifier"] = classifier
        elif classifier_for:
            say(f"{source}: no serving EC classifier; no classifier rows")
        if not labellers:
            progress.advance(test["load_pct"].n_unique())
            continue
        constant = most_frequent_label(train["ec_label"].to_numpy()) if train.height else None
        for (load,), group in test.group_by("load_pct", maintain_order=True):
            jobs = JobBatch.from_frame(group)
            for name, labeller in labellers.items():
                acc = label_accuracy_by_age(labeller, cfg, jobs, settings.ages_steps, constant_label=constant)
                frames.append(
                    acc.with_columns(
                        source=pl.lit(source), load_pct=pl.lit(load, pl.Int32), labeller=pl.lit(name)
                    )
                )
            progress.advance()
    if not frames:
        return pl.DataFrame(schema={**key, **LABEL_ACCURACY})
    return pl.concat(frames).select(*key, *LABEL_ACCURACY).sort(*key, "age_steps")


# --- the labeller the pipeline serves (`sim__job_sequences` fits it, `assets.ec.labellers` loads it) -----------

SERVED_LABELLERS = ("sim_view", "classifier")
"""What serves EC labels in the simulator: this module's labeller, or the EC classifier's serving copy
(`models.ec_serving`; TVW-RL's Algorithm 1 as first built)."""

SIM_VIEW_SERVING = {
    "source": pl.String,
    "served_labeller": pl.String,  # "sim_view" or "classifier": which labeller serves the source's EC labels
    "sim_view_n_train_jobs": pl.Int64,  # training-sequence jobs (every load) the simulator-view labeller saw
    "sim_view_path": pl.String,  # its saved file (null where the classifier serves)
}
"""Per real source of the sequences: which labeller serves its EC labels (joined into `sim__ec_serving`)."""


def serving_sim_labellers(
    sequences: pl.DataFrame,
    saved_path_of: Callable[[str], Path],
    served: str = "sim_view",
    log: Callable[[str], None] = print,
    config: SimLabellerConfig | None = None,
) -> pl.DataFrame:
    """For every real source of `sequences` (`sim__job_sequences`): with `served` = "sim_view", a labeller
    fitted on its training sequences (`fit_source_labeller`) saved at `sim_view_path` of its EC classifier's path
    (`saved_path_of(source)`, whether or not one was saved); where it cannot be fitted
    (fewer than 2 labels) or `served` = "classifier", any stale file is removed, so the classifier serves.
    SIM_VIEW_SERVING rows."""
    if served not in SERVED_LABELLERS:
        raise ValueError(f"served labeller must be one of {SERVED_LABELLERS}, got {served!r}")
    rows = []
    for source in sorted(set(sequences["source"].unique().to_list())):
        if is_synthetic(source):
            continue
        path = sim_view_path(saved_path_of(source))
        labeller, n_train = None, None
        if served == "sim_view":
            labeller, _, n_train = fit_source_labeller(sequences, source, config or SimLabellerConfig())
        if labeller is None:
            path.unlink(missing_ok=True)
            if served == "sim_view":
                log(f"{source}: training jobs hold fewer than 2 EC labels; the EC classifier serves labels")
        else:
            labeller.save(path, card={"source": source, "trained_on": f"{n_train} training-sequence jobs"})
            log(f"{source}: simulator-view EC labeller on {n_train} training-sequence jobs serves labels")
        rows.append(
            {
                "source": source,
                "served_labeller": "classifier" if labeller is None else "sim_view",
                "sim_view_n_train_jobs": n_train,
                "sim_view_path": None if labeller is None else str(path),
            }
        )
    return pl.DataFrame(rows, schema=SIM_VIEW_SERVING)


def served_labellers(
    saved_path_of: Callable[[str], Path], classifier: Callable[[str], AgeLabeller | None]
) -> Callable[[str], AgeLabeller | None]:
    """source -> the labeller that serves its EC labels in the simulator, loaded once: the simulator-view
    labeller saved at `sim_view_path(saved_path_of(source))` (`serving_sim_labellers`), else `classifier(source)`
    (the EC classifier's serving copy, or None)."""

    @functools.cache
    def labeller(source: str) -> AgeLabeller | None:
        path = sim_view_path(saved_path_of(source))
        return load_sim_labeller(path) if path.exists() else classifier(source)

    return labeller
