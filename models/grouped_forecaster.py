"""Many small LSTNets fitted at once: one forecaster per member set, trained side by side in one stacked model.

The prediction-gain proxy (`models.prediction_gain`) fits one LSTNet per EC of every mapping, of every random
control of it, and one EC-agnostic model, per forecaster seed: about 1,700 fits of 12 Adam steps each on the
embedded sample, where Python and torch's per-call overhead, not arithmetic, was the cost (80 ms per fit). Here
the G fits of one seed are G slices of one set of stacked parameters: every Adam step of every fit is one batched
forward (a grouped convolution, a GRU written with batched matrix products) and one backward.

Each slice is the fit `models.forecaster.fit_forecaster` makes on its member set alone, step for step: the same
initial weights (the fits' LSTNet built from the seed), the same training windows (the same draw from the same
generator), the same minibatch order (each fit's own generator), the same loss (the batch's mean squared error),
and Adam's per-element update; the slices share no parameter, so the summed loss gives each slice the gradient of
its own. A fit that has run all its steps (a member set with fewer windows has fewer batches per epoch, and more
epochs) keeps the weights of its last step. Results equal the one-at-a-time fits up to float rounding (a test
compares them). Configurations this does not cover (dropout, a validation split, early stopping, mixed precision)
are fitted one at a time by `fit_forecaster`, with the same result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from models.forecaster import (
    N_SERIES,
    ForecasterConfig,
    LSTNet,
    _window_pairs,
    as_series_list,
    fit_forecaster,
    predict_series,
    series_stats,
    torch_threads,
)

_WINDOWS_PER_CHUNK = 400_000
"""Training windows held at once (the fits of one call are trained in chunks of about this many windows:
400,000 x window 24 x 2 float32 is 77 MB)."""


def groupable(cfg: ForecasterConfig) -> bool:
    """Whether `fit_predict_many` trains fits of `cfg` side by side (otherwise one at a time)."""
    return cfg.dropout == 0.0 and cfg.val_fraction == 0.0 and cfg.patience == 0 and not cfg.amp


def fit_predict_many(
    values: np.ndarray | Sequence[np.ndarray],
    n_train: Sequence[int],
    member_sets: Sequence[np.ndarray],
    cfg: ForecasterConfig,
    stats: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[list[np.ndarray]]:
    """For each member set (indices into `values`), the held-out predictions of a forecaster trained on those
    workloads alone: entry i is `predict_series(fit_forecaster(members' series, members' n_train, cfg), ...)`, a
    list of (2, L_j - n_train[j]) arrays in the members' order. `stats` is `series_stats(values, n_train)` when
    the caller has it (each workload's own training mean and std, whatever set it is in)."""
    series = as_series_list(values)
    n_train = [int(t) for t in n_train]
    sets = [np.asarray(m, dtype=np.int64) for m in member_sets]
    for i, m in enumerate(sets):
        if m.ndim != 1 or m.size == 0:
            raise ValueError(
                f"member set {i}: expected a non-empty 1-D array of workload indices, got {m.shape}"
            )
        if m.min() < 0 or m.max() >= len(series):
            raise ValueError(f"member set {i}: index out of range for {len(series)} workloads")
    if not groupable(cfg):
        out = []
        for m in sets:
            part, nt = [series[j] for j in m], [n_train[j] for j in m]
            out.append(predict_series(fit_forecaster(part, nt, cfg), part, nt))
        return out
    need = cfg.window + cfg.horizon - 1
    for j in np.unique(np.concatenate(sets)):
        if n_train[j] < need:
            raise ValueError(
                f"workload {j}: training part has {n_train[j]} bins, fewer than window+horizon-1={need} needed before "
                "the first predicted bin"
            )
    stats = series_stats(series, n_train) if stats is None else stats
    z = _padded_standardised(series, stats)
    with torch_threads(cfg.n_threads):
        out: list[list[np.ndarray]] = []
        for chunk in _chunks(sets, series, n_train, cfg):
            out.extend(_fit_predict_chunk(z, series, n_train, chunk, cfg, stats))
        return out


def _padded_standardised(series: list[np.ndarray], stats: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """(n, 2, L_max) float32: each series standardised (in float64) with its own training mean and std, then
    rounded once, as the one-at-a-time fit rounds its windows; zero-padded."""
    mean, std = stats
    z = np.zeros((len(series), N_SERIES, max(s.shape[1] for s in series)), dtype=np.float32)
    for i, s in enumerate(series):
        z[i, :, : s.shape[1]] = (s - mean[i][:, None]) / std[i][:, None]
    return z


def _chunks(sets: list[np.ndarray], series, n_train, cfg: ForecasterConfig) -> list[list[np.ndarray]]:
    """The member sets in consecutive chunks of at most about `_WINDOWS_PER_CHUNK` training windows."""
    first = cfg.window + cfg.horizon - 1
    chunks: list[list[np.ndarray]] = [[]]
    held = 0
    for m in sets:
        n = int(sum(max(-(-(n_train[j] - first) // cfg.stride), 0) for j in m))
        n = n if cfg.max_train_windows is None else min(n, cfg.max_train_windows)
        if chunks[-1] and held + n > _WINDOWS_PER_CHUNK:
            chunks.append([])
            held = 0
        chunks[-1].append(m)
        held += n
    return chunks


def _gather(z: np.ndarray, workload: np.ndarray, target: np.ndarray, cfg: ForecasterConfig):
    """Input windows (n, window, 2) and targets (n, 2) of the (workload, target bin) pairs, float32."""
    ends = target - cfg.horizon + 1
    idx = ends[:, None] - cfg.window + np.arange(cfg.window)[None, :]
    x = z[workload[:, None], :, idx]  # (n, window, 2)
    return x.astype(np.float32), z[workload, :, target].astype(np.float32)


def _fit_predict_chunk(z, series, n_train, sets: list[np.ndarray], cfg: ForecasterConfig, stats):
    first = cfg.window + cfg.horizon - 1
    device = torch.device(cfg.device)
    xs, ys, plans = [], [], []
    offset = 0
    for i, m in enumerate(sets):
        nt = np.asarray([n_train[j] for j in m], dtype=np.int64)
        lo = np.full(len(m), first, dtype=np.int64)
        if np.maximum(nt - lo, 0).sum() == 0:
            raise ValueError(
                f"member set {i}: no training windows: every training part is shorter than "
                f"window+horizon={first + 1}"
            )
        pairs = _window_pairs(lo, nt, cfg.stride, cfg.max_train_windows, np.random.default_rng(cfg.seed))
        x, y = _gather(z, m[pairs[:, 0]], pairs[:, 1], cfg)
        xs.append(x)
        ys.append(y)
        plans.append(_batch_plan(len(x), offset, cfg))
        offset += len(x)
    x_all = torch.from_numpy(np.concatenate(xs)).to(device)
    y_all = torch.from_numpy(np.concatenate(ys)).to(device)
    model = GroupedLSTNet(cfg, len(sets)).to(device)
    _train(model, x_all, y_all, plans, cfg)
    return [_predict(model, g, z, series, n_train, m, cfg, stats) for g, m in enumerate(sets)]


def _batch_plan(n: int, offset: int, cfg: ForecasterConfig) -> list[np.ndarray]:
    """The row indices (into the stacked windows) of every Adam step of one fit, in order: the epochs and
    minibatch order `models.training.train_minibatches` draws for a fit of n windows seeded `cfg.seed` (its
    generator first initialises the LSTNet, as in `fit_forecaster`)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    LSTNet(cfg, gen)  # draws the initial weights from the generator, as the one-at-a-time fit does
    n_batches = math.ceil(n / cfg.batch_size)
    n_epochs = max(cfg.epochs, math.ceil(cfg.min_steps / n_batches))
    steps = []
    for _ in range(n_epochs):
        order = torch.randperm(n, generator=gen).numpy() + offset
        steps.extend(order[s : s + cfg.batch_size] for s in range(0, n, cfg.batch_size))
    return steps


class GroupedLSTNet(nn.Module):
    """G independent `models.forecaster.LSTNet`s (no dropout) as stacked parameters: input (G, B, window, 2),
    output (G, B, 2); slice g computes what LSTNet g would on its own rows. Every slice starts from the weights
    LSTNet(cfg, Generator seeded cfg.seed) draws."""

    def __init__(self, cfg: ForecasterConfig, n_groups: int) -> None:
        super().__init__()
        self.cfg = cfg
        base = LSTNet(cfg, torch.Generator().manual_seed(cfg.seed))

        def stacked(p: torch.Tensor) -> nn.Parameter:
            return nn.Parameter(p.detach().unsqueeze(0).repeat(n_groups, *([1] * p.dim())).contiguous())

        self.conv_w, self.conv_b = stacked(base.conv.weight), stacked(base.conv.bias)
        self.gru = [stacked(p) for p in _gru_params(base.gru)]
        self.skip = None if base.skip_gru is None else [stacked(p) for p in _gru_params(base.skip_gru)]
        self.out_w, self.out_b = stacked(base.out.weight), stacked(base.out.bias)
        self.ar_w = None if base.ar is None else stacked(base.ar.weight)
        self.ar_b = None if base.ar is None else stacked(base.ar.bias)
        for name, ps in (("gru", self.gru), ("skip", self.skip or [])):
            for i, p in enumerate(ps):
                self.register_parameter(f"{name}_{i}", p)

    def slice_state(self, g: int) -> list[torch.Tensor]:
        return [p[g].detach().clone() for p in self.parameters()]

    def load_slice(self, g: int, state: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for p, s in zip(self.parameters(), state, strict=True):
                p[g].copy_(s)

    def forward(self, x: torch.Tensor, groups: slice | None = None) -> torch.Tensor:
        """x (G', B, window, 2) for the slices `groups` (all of them when None) -> (G', B, 2)."""
        sel = slice(None) if groups is None else groups

        def p(t: torch.Tensor) -> torch.Tensor:
            return t[sel]

        g, b, w, d = x.shape
        k = self.cfg.kernel_size
        conv_w = p(self.conv_w)  # (G, C, 2, K)
        channels = conv_w.shape[1]
        # the convolution as one batched product over every (window, offset): slice g with its own filters
        patches = x.unfold(2, k, 1)  # (G, B, T', 2, K)
        n_out = patches.shape[2]
        c = torch.baddbmm(
            p(self.conv_b).unsqueeze(1),
            patches.reshape(g, b * n_out, d * k),
            conv_w.reshape(g, channels, d * k).transpose(1, 2),
        )
        c = torch.relu(c).reshape(g, b, n_out, channels)  # (G, B, T', C)
        r = _gru_last(c, [p(t) for t in self.gru])
        if self.skip is not None:
            period = self.cfg.skip_period
            n_steps = c.shape[2] // period
            s = c[:, :, -n_steps * period :, :].reshape(g, b, n_steps, period, channels).transpose(2, 3)
            hs = _gru_last(s.reshape(g, b * period, n_steps, channels), [p(t) for t in self.skip])
            r = torch.cat([r, hs.reshape(g, b, -1)], dim=2)
        y = torch.baddbmm(p(self.out_b).unsqueeze(1), r, p(self.out_w).transpose(1, 2))
        if self.ar_w is not None:
            last = x[:, :, -self.cfg.ar_window :, :]  # (G, B, A, 2)
            y = y + torch.einsum("gbad,ga->gbd", last, p(self.ar_w)[:, 0, :]) + p(self.ar_b).unsqueeze(1)
        return y


def _gru_params(gru: nn.GRU) -> list[torch.Tensor]:
    return [gru.weight_ih_l0, gru.weight_hh_l0, gru.bias_ih_l0, gru.bias_hh_l0]


def _gru_last(x: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
    """The last hidden state (G, B, H) of one-layer GRUs (torch's gate equations, gates r, z, n; h0 = 0) over
    x (G, B, T, C), slice g with its own weights."""
    w_ih, w_hh, b_ih, b_hh = params
    g, b, t, _ = x.shape
    hidden = w_hh.shape[2]
    gi = torch.baddbmm(b_ih.unsqueeze(1), x.reshape(g, b * t, -1), w_ih.transpose(1, 2)).reshape(g, b, t, -1)
    h = x.new_zeros(g, b, hidden)
    w_hh_t, b_hh = w_hh.transpose(1, 2), b_hh.unsqueeze(1)
    # unbind, not indexing: its backward is one stack, not a zero-filled copy per step
    for gi_step in gi.unbind(2):
        gh = torch.baddbmm(b_hh, h, w_hh_t)
        i_r, i_z, i_n = gi_step.split(hidden, dim=2)
        h_r, h_z, h_n = gh.split(hidden, dim=2)
        r = torch.sigmoid(i_r + h_r)
        u = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        h = n + u * (h - n)
    return h


def _train(
    model: GroupedLSTNet, x_all: torch.Tensor, y_all: torch.Tensor, plans, cfg: ForecasterConfig
) -> None:
    """Adam on every slice at once, each on its own plan of minibatches; a slice that has run its last step keeps
    those weights (restored at the end: Adam's moments would move it on zero gradients)."""
    n_groups, size = len(plans), cfg.batch_size
    device = x_all.device
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    n_steps = max(len(p) for p in plans)
    finished: dict[int, list[torch.Tensor]] = {}
    idx = np.zeros((n_groups, size), dtype=np.int64)
    weight = np.zeros((n_groups, size), dtype=np.float32)
    total = torch.zeros(n_groups, dtype=torch.float64, device=device)
    model.train()
    for step in range(n_steps):
        idx[:] = 0
        weight[:] = 0.0
        for g, plan in enumerate(plans):
            if step < len(plan):
                rows = plan[step]
                idx[g, : len(rows)] = rows
                weight[g, : len(rows)] = 1.0 / (len(rows) * N_SERIES)  # each slice's own batch mean
        rows_t = torch.from_numpy(idx).to(device)
        w_t = torch.from_numpy(weight).to(device)
        err = (model(x_all[rows_t]) - y_all[rows_t]).square().sum(dim=2) * w_t  # (G, B)
        per_group = err.sum(dim=1)
        opt.zero_grad()
        per_group.sum().backward()
        opt.step()
        total += per_group.detach()
        for g, plan in enumerate(plans):
            if step == len(plan) - 1:
                finished[g] = model.slice_state(g)
    bad = torch.nonzero(~torch.isfinite(total)).flatten().tolist()
    if bad:
        raise FloatingPointError(f"grouped LSTNet fit: training loss is not finite for member set(s) {bad}")
    for g, state in finished.items():
        model.load_slice(g, state)
    model.eval()


def _predict(model: GroupedLSTNet, g: int, z, series, n_train, members, cfg, stats, batch_size: int = 4096):
    """Slice g's predictions for bins n_train[j]..L_j - 1 of each member j, in original units."""
    mean, std = stats
    counts = [series[j].shape[1] - n_train[j] for j in members]
    workload = np.repeat(members, counts)
    target = np.concatenate([np.arange(n_train[j], series[j].shape[1]) for j in members])
    x, _ = _gather(z, workload, target, cfg)
    device = next(model.parameters()).device
    with torch.no_grad():
        preds = [
            model(torch.from_numpy(x[s : s + batch_size]).to(device).unsqueeze(0), slice(g, g + 1))[0]
            .float()
            .cpu()
            .numpy()
            for s in range(0, len(x), batch_size)
        ]
    p = np.concatenate(preds).astype(np.float64)
    out = []
    for j, part in zip(members, np.split(p, np.cumsum(counts)[:-1]), strict=True):
        out.append(part.T * std[j][:, None] + mean[j][:, None])
    return out
