"""EC prediction for TVW-RL's run-time logic (Algorithm 1, ClassifyToEC): meta information + partial usage -> EC label.

Inputs per workload:
- meta (n, 4) float in META_COLUMNS order (requested cpu/mem fraction of a machine, priority, scheduling class);
  NaN marks a missing value. Missing values are imputed with the training mean and flagged by one is_missing column
  per meta column.
- prefix (n, 2, j) float: the first j 5-minute bins of (cpu_frac, mem_frac), or None. The model uses the first m bins
  (`ClassifierConfig.prefix_bins`; m = 0 means meta only). At prediction time a prefix shorter than m, or NaN bins
  (a running workload younger than m bins), is zero-padded in standardised space, i.e. the missing bins are set to
  their training mean; no separate meta-only model is kept.

Model (TVW-RL "Implementation", EC Prediction): two dense ReLU layers and a softmax output, trained with Adam on
categorical cross-entropy (CrossEntropyLoss on logits; softmax applied in `predict_proba`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
import torch
from scipy import stats
from sklearn.metrics import f1_score
from sklearn.model_selection import train_test_split
from torch import nn

from models.forecaster import torch_threads
from models.training import init_parameters, train_minibatches
from pipelines.features import SeriesSet
from pipelines.workloads import WORKLOAD_GROUP_PATTERN, workload_groups

META_COLUMNS = ("cpu_request_frac", "mem_request_frac", "priority", "scheduling_class")
"""Meta-feature columns (from the WORKLOADS table) in the order `meta` arrays use."""

ACCURACY_ROWS = {
    "prefix_bins": pl.Int64,  # m: usage bins fed to the classifier (0 = meta only)
    "accuracy": pl.Float64,  # held-out accuracy, mean over the splits
    "accuracy_ci_low": pl.Float64,  # 95 % corrected resampled t-interval over the splits (Nadeau & Bengio)
    "accuracy_ci_high": pl.Float64,
    "macro_f1": pl.Float64,  # mean over the splits
    "majority_accuracy": pl.Float64,  # always predicting the training split's most common EC, mean over splits
    "majority_accuracy_ci_low": pl.Float64,
    "majority_accuracy_ci_high": pl.Float64,
    "best_constant_accuracy": pl.Float64,  # the best constant guess for each test split (its most common EC)
    "best_constant_accuracy_ci_low": pl.Float64,
    "best_constant_accuracy_ci_high": pl.Float64,
    "n_splits": pl.Int64,  # repeated train/test splits the means are over
    "n_train": pl.Int64,  # workloads in a training split (mean over the splits, rounded)
    "n_test": pl.Int64,  # workloads in a held-out split (mean, rounded)
    "n_groups_train": pl.Int64,  # workload groups in a training split (a group is never on both sides)
    "n_groups_test": pl.Int64,
    "split": pl.String,  # how train and test were separated
}
"""One row per prefix length of `classifier_accuracy_table`."""


@dataclass(frozen=True)
class ClassifierConfig:
    """EC classifier size and training budget (the paper gives the architecture, not the sizes)."""

    prefix_bins: int = 12
    """m: first bins of cpu and mem usage fed to the model (0 = meta only); 12 bins = 1 h. The saved model of
    ec__classifier_accuracy uses this m: it labels an incoming workload from meta alone (its usage bins are
    missing, as Algorithm 1's ClassifyToEC with resource_usage = null) and a running one from its first m bins."""
    hidden_sizes: tuple[int, int] = (64, 32)
    """The two dense ReLU layers."""
    epochs: int = 200
    """Passes over the training set."""
    batch_size: int = 64
    """Workloads per Adam step."""
    lr: float = 1e-3
    """Adam learning rate."""
    test_frac: float = 0.3
    """Held-out share for `classifier_accuracy_table`."""
    n_splits: int = 10
    """Repeated seeded splits (by workload group) `classifier_accuracy_table` averages over (seed, seed+1, ...)."""
    seed: int = 0
    """Seeds init, shuffling and the train/test splits."""
    n_threads: int | None = 1
    """Torch intra-op threads while training (restored after); None = leave as is."""


@dataclass(frozen=True)
class ClassifierRunSettings:
    """Settings of ec__classifier_accuracy: the classifier, the usage-prefix lengths its held-out accuracy is
    measured at, and which workloads may be split apart."""

    classifier: ClassifierConfig = field(default_factory=ClassifierConfig)
    """Size, training budget and splits; its prefix_bins is the m of the saved model."""
    prefix_lengths: tuple[int, ...] = (0, 6, 12, 24, 48)
    """Usage bins m fed to the classifier: one accuracy row each."""
    min_per_class: int = 5
    """Train only with at least this many workloads per EC."""
    group_pattern: str = WORKLOAD_GROUP_PATTERN
    """Regex whose first group names a workload's group (windows of one longer workload, e.g. the derived Google
    job-days '<job>_d<k>'); a group is wholly in train or in test. A workload id that does not match is its own
    group."""


class EcClassifier(nn.Module):
    """Two dense ReLU layers and a linear output; forward gives logits (softmax in `probabilities`).

    Input normalisation (imputation means, standardisation stats) lives in buffers, so the state_dict is self-contained.
    """

    def __init__(self, n_meta: int, prefix_bins: int, n_classes: int, hidden_sizes: tuple[int, int]) -> None:
        super().__init__()
        n_in = 2 * n_meta + 2 * prefix_bins  # meta, is_missing flags, cpu bins, mem bins
        self.net = nn.Sequential(
            nn.Linear(n_in, hidden_sizes[0]),
            nn.ReLU(),
            nn.Linear(hidden_sizes[0], hidden_sizes[1]),
            nn.ReLU(),
            nn.Linear(hidden_sizes[1], n_classes),
        )
        self.register_buffer("meta_fill", torch.zeros(n_meta, dtype=torch.float64))
        self.register_buffer("input_mean", torch.zeros(n_in, dtype=torch.float64))
        self.register_buffer("input_std", torch.ones(n_in, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def probabilities(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.forward(x), dim=1)


def meta_matrix(workloads: pl.DataFrame) -> np.ndarray:
    """(n, 4) float meta array from a WORKLOADS-like frame, META_COLUMNS order, nulls as NaN."""
    missing = [c for c in META_COLUMNS if c not in workloads.columns]
    if missing:
        raise ValueError(f"workloads frame lacks meta column(s) {missing}")
    return workloads.select([pl.col(c).cast(pl.Float64) for c in META_COLUMNS]).to_numpy().astype(np.float64)


def _raw_features(meta: np.ndarray, prefixes: np.ndarray | None, meta_fill: np.ndarray, m: int) -> np.ndarray:
    """Unstandardised inputs: imputed meta, is_missing flags, first m cpu bins, first m mem bins (NaN = missing)."""
    is_missing = np.isnan(meta)
    parts = [np.where(is_missing, meta_fill[None, :], meta), is_missing.astype(np.float64)]
    if m > 0:
        pre = np.full((meta.shape[0], 2, m), np.nan)
        if prefixes is not None:
            j = min(m, prefixes.shape[2])
            pre[:, :, :j] = prefixes[:, :, :j]
        parts.append(pre.reshape(meta.shape[0], 2 * m))
    return np.concatenate(parts, axis=1)


def _check_inputs(meta: np.ndarray, prefixes: np.ndarray | None, n_meta: int | None = None) -> np.ndarray:
    meta = np.asarray(meta, dtype=np.float64)
    if meta.ndim != 2 or (n_meta is not None and meta.shape[1] != n_meta):
        raise ValueError(f"meta must have shape (n, {n_meta or 'n_meta'}), got {meta.shape}")
    if prefixes is not None:
        if prefixes.ndim != 3 or prefixes.shape[:2] != (meta.shape[0], 2):
            raise ValueError(f"prefixes must have shape ({meta.shape[0]}, 2, bins), got {prefixes.shape}")
    return meta


@dataclass(frozen=True)
class TrainedClassifier:
    """A trained EcClassifier with its label set and config; `predict` is ClassifyToEC."""

    model: EcClassifier
    classes: np.ndarray  # EC label of each output unit
    cfg: ClassifierConfig

    def features(self, meta: np.ndarray, prefixes: np.ndarray | None) -> torch.Tensor:
        """Standardised model inputs; missing prefix bins become 0 (their training mean)."""
        meta = _check_inputs(meta, prefixes, self.model.meta_fill.shape[0])
        raw = _raw_features(meta, prefixes, self.model.meta_fill.numpy(), self.cfg.prefix_bins)
        z = (raw - self.model.input_mean.numpy()) / self.model.input_std.numpy()
        return torch.from_numpy(np.nan_to_num(z, nan=0.0).astype(np.float32))

    def predict_proba(self, meta: np.ndarray, prefixes: np.ndarray | None = None) -> np.ndarray:
        """(n, n_classes) softmax probabilities, columns in `classes` order."""
        with torch.no_grad():
            return self.model.probabilities(self.features(meta, prefixes)).numpy()

    def predict(self, meta: np.ndarray, prefixes: np.ndarray | None = None) -> np.ndarray:
        """EC label per workload (prefixes may be shorter than prefix_bins, NaN-padded, or None)."""
        return self.classes[self.predict_proba(meta, prefixes).argmax(axis=1)]

    def save(self, path: str | Path, card: dict | None = None) -> None:
        """One torch file: state_dict (with normalisation buffers), config, label set, input sizes, and the
        model's card (`card`: what it was trained on and how well it did, plain JSON-like values; read back
        with `read_card`). Written to a temporary sibling and renamed, so a reader never loads half a file; the
        folder is made when missing."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            torch.save(
                {
                    "state_dict": self.model.state_dict(),
                    "config": dataclasses.asdict(self.cfg),
                    "classes": self.classes.tolist(),
                    "n_meta": int(self.model.meta_fill.shape[0]),
                    "card": dict(card or {}),
                },
                tmp,
            )
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)


def read_card(path: str | Path) -> dict:
    """The card saved with a classifier (empty for a file saved without one)."""
    return dict(torch.load(Path(path), weights_only=True).get("card", {}))


def load_classifier(path: str | Path) -> TrainedClassifier:
    """Read a file written by `TrainedClassifier.save`."""
    blob = torch.load(Path(path), weights_only=True)
    cfg_dict = dict(blob["config"])
    cfg_dict["hidden_sizes"] = tuple(cfg_dict["hidden_sizes"])
    cfg = ClassifierConfig(**cfg_dict)
    classes = np.asarray(blob["classes"])
    model = EcClassifier(blob["n_meta"], cfg.prefix_bins, len(classes), cfg.hidden_sizes)
    model.load_state_dict(blob["state_dict"])
    model.eval()
    return TrainedClassifier(model=model, classes=classes, cfg=cfg)


def train_classifier(
    meta: np.ndarray, prefixes: np.ndarray | None, labels: np.ndarray, cfg: ClassifierConfig
) -> TrainedClassifier:
    """Fit normalisation stats and the network on all given workloads (split beforehand to evaluate)."""
    meta = _check_inputs(meta, prefixes)
    labels = np.asarray(labels)
    if labels.shape != (meta.shape[0],):
        raise ValueError(f"labels has shape {labels.shape}; expected ({meta.shape[0]},)")
    classes, y = np.unique(labels, return_inverse=True)
    if len(classes) < 2:
        raise ValueError(
            f"labels contain {len(classes)} class(es) {classes.tolist()}; a classifier needs at least 2"
        )
    if cfg.prefix_bins > 0 and (prefixes is None or prefixes.shape[2] < cfg.prefix_bins):
        have = 0 if prefixes is None else prefixes.shape[2]
        raise ValueError(f"training needs a usage prefix of {cfg.prefix_bins} bins per workload, got {have}")

    # normalisation: training means fill missing meta; every input column standardised with training stats
    fill, _ = _column_stats(meta)
    mean, std = _column_stats(_raw_features(meta, prefixes, fill, cfg.prefix_bins))

    gen = torch.Generator().manual_seed(cfg.seed)
    model = EcClassifier(meta.shape[1], cfg.prefix_bins, len(classes), cfg.hidden_sizes)
    init_parameters(model, gen)
    model.meta_fill.copy_(torch.from_numpy(fill))
    model.input_mean.copy_(torch.from_numpy(mean))
    model.input_std.copy_(torch.from_numpy(std))
    trained = TrainedClassifier(model=model, classes=classes, cfg=cfg)

    x, y_t = trained.features(meta, prefixes), torch.from_numpy(y.astype(np.int64))
    with torch_threads(cfg.n_threads):
        train_minibatches(
            model,
            x,
            y_t,
            nn.functional.cross_entropy,
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            n_epochs=cfg.epochs,
            generator=gen,
        )
    model.eval()
    return trained


def _column_stats(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean and std over the finite entries; mean 0 for an all-missing column, std 1 where it is 0."""
    finite = np.isfinite(a)
    count = np.maximum(finite.sum(axis=0), 1)
    mean = np.where(finite, a, 0.0).sum(axis=0) / count
    var = (np.where(finite, a - mean, 0.0) ** 2).sum(axis=0) / count
    std = np.sqrt(var)
    return mean, np.where(std > 0, std, 1.0)


def evaluate(
    clf: TrainedClassifier, meta: np.ndarray, prefixes: np.ndarray | None, labels: np.ndarray
) -> tuple[float, float]:
    """(accuracy, macro F1) of `clf` on the given (held-out) workloads."""
    labels = np.asarray(labels)
    pred = clf.predict(meta, prefixes)
    return float((pred == labels).mean()), float(f1_score(labels, pred, average="macro", zero_division=0))


def split_train_test(labels: np.ndarray, test_frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (train_idx, test_idx); stratified by label when every class has >= 2 members and the test set
    can hold one of each class, plain random otherwise."""
    labels = np.asarray(labels)
    n = len(labels)
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise ValueError(f"labels contain {len(classes)} class(es); a classifier needs at least 2")
    n_test = max(1, round(test_frac * n))
    if n - n_test < 2:
        raise ValueError(
            f"too few workloads to split: {n} workloads, test_frac={test_frac} leaves {n - n_test} to train"
        )
    stratify = labels if counts.min() >= 2 and len(classes) <= n_test <= n - len(classes) else None
    idx = np.arange(n)
    train_idx, test_idx = train_test_split(idx, test_size=n_test, random_state=seed, stratify=stratify)
    if len(np.unique(labels[train_idx])) < 2:
        raise ValueError(
            f"training split of {len(train_idx)} workloads holds a single class; need more workloads"
        )
    return np.sort(train_idx), np.sort(test_idx)


def split_by_group(
    labels: np.ndarray, groups: np.ndarray, test_frac: float, seed: int, max_tries: int = 50
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded (train_idx, test_idx) with every group (e.g. all days of one job) wholly on one side: about
    `test_frac` of the groups are held out. Redrawn (seed, seed+1, ...) until the training side holds at
    least 2 classes and the test side at least one workload."""
    labels, groups = np.asarray(labels), np.asarray(groups)
    if labels.shape != groups.shape:
        raise ValueError(f"labels {labels.shape} and groups {groups.shape} differ in shape")
    if len(np.unique(labels)) < 2:
        raise ValueError(f"labels contain {len(np.unique(labels))} class(es); a classifier needs at least 2")
    uniq = np.unique(groups)
    n_test = max(1, round(test_frac * len(uniq)))
    if len(uniq) - n_test < 1:
        raise ValueError(f"too few groups to split: {len(uniq)} group(s), test_frac={test_frac}")
    for t in range(max_tries):
        rng = np.random.default_rng([seed, t])
        held = rng.choice(uniq, size=n_test, replace=False)
        is_test = np.isin(groups, held)
        train_idx, test_idx = np.flatnonzero(~is_test), np.flatnonzero(is_test)
        if len(np.unique(labels[train_idx])) >= 2 and len(test_idx):
            return train_idx, test_idx
    raise ValueError(f"no split by group in {max_tries} draws leaves 2 classes for training")


def usage_prefixes(series: np.ndarray | Sequence[np.ndarray], m: int) -> np.ndarray:
    """(n, 2, m) first m bins of each (2, L_i) usage series; NaN where a series is shorter than m."""
    out = np.full((len(series), 2, m), np.nan)
    for i, s in enumerate(series):
        s = np.asarray(s, dtype=np.float64)
        j = min(m, s.shape[1])
        out[i, :, :j] = s[:, :j]
    return out


def resampled_interval(
    values: Sequence[float], n_train: float, n_test: float, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(mean, low, high) of a score over J repeated train/test splits, with Nadeau & Bengio's (2003) corrected
    resampled t-interval: the splits share training workloads, so their scores are correlated and the plain
    t-interval is too narrow; the variance of the mean is taken as (1/J + n_test/n_train) * s^2, t with J - 1
    degrees of freedom. One split: a zero-width interval."""
    a = np.asarray(values, dtype=np.float64)
    m = float(a.mean())
    if len(a) < 2:
        return m, m, m
    half = float(
        stats.t.ppf(0.5 + confidence / 2, len(a) - 1)
        * np.sqrt((1.0 / len(a) + n_test / n_train) * a.var(ddof=1))
    )
    return m, m - half, m + half


def _split(labels: np.ndarray, groups: np.ndarray | None, cfg: ClassifierConfig, i: int):
    if groups is None:
        return split_train_test(labels, cfg.test_frac, cfg.seed + i)
    return split_by_group(labels, groups, cfg.test_frac, cfg.seed + i)


def classifier_accuracy_table(
    meta: np.ndarray,
    series: np.ndarray | Sequence[np.ndarray],
    labels: np.ndarray,
    prefix_lengths: Sequence[int],
    cfg: ClassifierConfig,
    groups: np.ndarray | None = None,
) -> pl.DataFrame:
    """Held-out accuracy / macro F1 of the EC classifier per usage-prefix length m (ACCURACY_ROWS) over
    cfg.n_splits seeded splits (seed, seed + 1, ...; the same splits for every m), as means with a 95 %
    corrected resampled t-interval (`resampled_interval`), beside two constant baselines on the same splits:
    the training split's majority EC, and the best constant guess of each test split (its own most common
    EC, what any constant predictor can reach at most). With `groups` (one id per workload, e.g. the job of a
    job-day) every split is by group: all workloads of a group are on the same side, so the model is never
    tested on another day of a job it trained on."""
    labels = np.asarray(labels)
    groups_arr = None if groups is None else np.asarray(groups)
    ids = np.arange(len(labels)).astype(str) if groups_arr is None else groups_arr
    splits = [_split(labels, groups_arr, cfg, i) for i in range(cfg.n_splits)]
    majority, best_constant, sizes = [], [], []
    for train_idx, test_idx in splits:
        values, counts = np.unique(labels[train_idx], return_counts=True)
        majority.append(float((labels[test_idx] == values[counts.argmax()]).mean()))
        best_constant.append(float(np.unique(labels[test_idx], return_counts=True)[1].max() / len(test_idx)))
        sizes.append(
            (len(train_idx), len(test_idx), len(np.unique(ids[train_idx])), len(np.unique(ids[test_idx])))
        )
    n_train, n_test, g_train, g_test = (round(float(np.mean(c))) for c in zip(*sizes, strict=True))
    side = "by workload group (a group wholly on one side)" if groups_arr is not None else "by workload"
    split = (
        f"{cfg.n_splits} seeded splits {side}, test_frac {cfg.test_frac}"
        + (" of the groups" if groups_arr is not None else ", stratified when possible")
        + "; 95 % corrected resampled t-intervals"
    )
    base = [resampled_interval(x, n_train, n_test) for x in (majority, best_constant)]
    rows = []
    for m in prefix_lengths:
        pre = usage_prefixes(series, m) if m > 0 else None
        c = dataclasses.replace(cfg, prefix_bins=m)
        acc, f1 = [], []
        for train_idx, test_idx in splits:
            clf = train_classifier(
                meta[train_idx], None if pre is None else pre[train_idx], labels[train_idx], c
            )
            a, f = evaluate(clf, meta[test_idx], None if pre is None else pre[test_idx], labels[test_idx])
            acc.append(a)
            f1.append(f)
        rows.append(
            (
                m,
                *resampled_interval(acc, n_train, n_test),
                float(np.mean(f1)),
                *base[0],
                *base[1],
                cfg.n_splits,
                n_train,
                n_test,
                g_train,
                g_test,
                split,
            )
        )
    return pl.DataFrame(rows, schema=ACCURACY_ROWS, orient="row")


# --- ec__classifier_accuracy ---------------------------------------------------------------------------------------


def too_few_labelled(labelled: pl.DataFrame, settings: ClassifierRunSettings) -> str | None:
    """Why no classifier is trained on these labelled workloads (fewer than 2 ECs or than min_per_class per
    EC), or None."""
    n_classes = labelled["ec_label"].n_unique()
    if n_classes < 2 or labelled.height < settings.min_per_class * n_classes:
        return (
            f"{labelled.height} labelled workloads in {n_classes} EC(s): fewer than 2 ECs or than "
            f"{settings.min_per_class} per EC; no classifier trained"
        )
    return None


@dataclass(frozen=True)
class ClassifierRun:
    """What `accuracy_and_model` gives: the accuracy table, the model trained on every labelled workload, its
    card, and how many workloads and groups it was trained on."""

    table: pl.DataFrame
    model: TrainedClassifier
    card: dict
    n_labelled: int
    n_groups: int


def with_series(labelled: pl.DataFrame, series: SeriesSet) -> tuple[pl.DataFrame, list[np.ndarray]]:
    """The rows of `labelled` whose workload has a series in `series`, and those series in the same order."""
    order = {w: i for i, w in enumerate(series.workload_ids.tolist())}
    labelled = labelled.filter(pl.col("workload_id").is_in(list(order)))
    every = series.series_list()
    return labelled, [every[order[w]] for w in labelled["workload_id"]]


def accuracy_and_model(
    labelled: pl.DataFrame, series: SeriesSet, settings: ClassifierRunSettings, source: str
) -> ClassifierRun:
    """The accuracy table (ACCURACY_ROWS) of the EC classifier on `labelled` (EC labels joined with the
    workloads' meta columns; those with a series) over repeated splits by workload group, and the model trained
    on all of them (m = settings.classifier.prefix_bins) with its card. `series` holds at least
    max(prefix_lengths) bins."""
    labelled, values = with_series(labelled, series)
    meta, labels = meta_matrix(labelled), labelled["ec_label"].to_numpy()
    groups = workload_groups(labelled["workload_id"].to_list(), settings.group_pattern)
    cfg = settings.classifier
    table = classifier_accuracy_table(meta, values, labels, settings.prefix_lengths, cfg, groups=groups)
    m = cfg.prefix_bins
    final = train_classifier(meta, usage_prefixes(values, m) if m else None, labels, cfg)
    n_groups = len(np.unique(groups))
    card = classifier_card(table, source, m, len(labels), n_groups)
    return ClassifierRun(table, final, card, len(labels), n_groups)


def classifier_card(table: pl.DataFrame, source: str, prefix_bins: int, n: int, n_groups: int) -> dict:
    """What the saved classifier is and how well its kind did: trained on all n labelled workloads of the
    source, with the accuracy table's numbers (every m; the saved model's m marked)."""
    return {
        "source": source,
        "trained_on": f"all {n} labelled workloads ({n_groups} groups) of {source}",
        "prefix_bins": prefix_bins,
        "split": table["split"][0] if table.height else "",
        "accuracy_by_prefix_bins": [
            {k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items() if k != "split"}
            for r in table.iter_rows(named=True)
        ],
    }


ACCURACY_CHECK_DOCS = {
    "beats_best_constant": "WARN: at some usage-prefix length m the held-out accuracy is above the best constant "
    "guess of the test splits (a classifier that never is has learned nothing); passes with a note when too few "
    "workloads were labelled to train one.",
}
"""The check of `ec__classifier_accuracy` (`accuracy_check_values`): name -> what passing means."""


def accuracy_check_values(
    table: pl.DataFrame, why_not_trained: str | None = None
) -> dict[str, tuple[bool, dict]]:
    """Check name (ACCURACY_CHECK_DOCS) -> (passed, metadata) of an ACCURACY_ROWS table."""
    if why_not_trained:
        return {"beats_best_constant": (True, {"note": f"not trained: {why_not_trained}"})}
    margin = (table["accuracy"] - table["best_constant_accuracy"]).fill_nan(None).drop_nulls()
    best = float(margin.max()) if margin.len() else float("nan")
    return {
        "beats_best_constant": (
            margin.len() > 0 and best > 0,
            {"best_margin_over_constant": best, "n_prefix_lengths": table.height},
        )
    }
