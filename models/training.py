"""Pieces shared by the small torch models: seeded initialisation, the minibatch Adam loop, and the learning-curve
table of a partition's training runs (one run per source)."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import polars as pl
import torch
from torch import nn

from pipelines.synthetic import SYNTHETIC_WORKLOADS
from pipelines.table_checks import CheckValues, table_check


def init_parameters(module: nn.Module, generator: torch.Generator) -> None:
    """torch's default uniform(+-1/sqrt(fan_in)) initialisation of Linear, Conv1d and GRU layers, drawn from
    `generator` instead of the global RNG (so a fit is reproducible from its config's seed)."""
    for sub in module.modules():
        if isinstance(sub, nn.GRU):
            fan_in = sub.hidden_size
        elif isinstance(sub, nn.Conv1d | nn.Linear):
            fan_in = sub.weight[0].numel()
        else:
            continue
        bound = 1.0 / math.sqrt(fan_in)
        with torch.no_grad():
            for p in sub.parameters(recurse=False):
                p.uniform_(-bound, bound, generator=generator)


@dataclass(frozen=True)
class TrainLog:
    """What a `train_minibatches` run did: the last epoch's training loss, the epochs run, and, with a
    validation split, each epoch's validation loss and the epoch whose weights were kept (0-based)."""

    final_loss: float
    epochs: int
    val_losses: tuple[float, ...] = ()
    best_epoch: int | None = None

    @property
    def best_val(self) -> float | None:
        return None if self.best_epoch is None else self.val_losses[self.best_epoch]


def train_minibatches(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    lr: float,
    batch_size: int,
    n_epochs: int,
    generator: torch.Generator,
    validation: tuple[torch.Tensor, torch.Tensor] | None = None,
    patience: int = 0,
    autocast_dtype: torch.dtype | None = None,
    on_epoch: Callable[[int, float, float | None], None] | None = None,
) -> TrainLog:
    """Adam over up to `n_epochs` passes of shuffled minibatches (order drawn from `generator`, a CPU generator);
    x, y (and the validation pair) may live on any device, the model's.

    With `validation`, its loss (`loss_fn`, batches of 8 x batch_size, eval mode) is measured after every epoch;
    `patience` > 0 stops after that many epochs without a new lowest validation loss, and the weights of the best
    epoch are restored. `autocast_dtype` runs forward and loss under torch.autocast on the tensors' device
    (bfloat16 on a GPU: mixed precision; the weights and Adam stay float32). `on_epoch(epoch, train_loss,
    val_loss)` is called after every epoch (progress for long fits)."""
    if patience > 0 and validation is None:
        raise ValueError("train_minibatches: patience needs a validation split")
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    device = x.device
    epoch_loss = float("nan")
    val_losses: list[float] = []
    best, best_state, since = None, None, 0

    def autocast():
        if autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=autocast_dtype)

    epochs = 0
    for _ in range(n_epochs):
        model.train()
        order = torch.randperm(len(x), generator=generator).to(device)
        total = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device: no sync per step
        for start in range(0, len(order), batch_size):
            b = order[start : start + batch_size]
            with autocast():
                loss = loss_fn(model(x[b]).float(), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach() * len(b)
        epoch_loss = float(total) / len(x)
        epochs += 1
        if not math.isfinite(epoch_loss):
            raise FloatingPointError(f"train_minibatches: training loss is {epoch_loss} at epoch {epochs}")
        v = (
            None
            if validation is None
            else _validation_loss(model, loss_fn, validation, 8 * batch_size, autocast)
        )
        if v is not None and not math.isfinite(v):
            raise FloatingPointError(f"train_minibatches: validation loss is {v} at epoch {epochs}")
        if on_epoch is not None:
            on_epoch(epochs, epoch_loss, v)
        if v is None:
            continue
        val_losses.append(v)
        if best is None or v < val_losses[best]:
            best, since = len(val_losses) - 1, 0
            best_state = copy.deepcopy(model.state_dict()) if patience > 0 else None
        else:
            since += 1
            if patience > 0 and since >= patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    kept = best if patience > 0 else len(val_losses) - 1  # without early stopping, the last epoch's weights
    return TrainLog(
        final_loss=epoch_loss,
        epochs=epochs,
        val_losses=tuple(val_losses),
        best_epoch=kept if val_losses else None,
    )


def _validation_loss(
    model: nn.Module, loss_fn, validation: tuple[torch.Tensor, torch.Tensor], step: int, autocast
):
    """Mean `loss_fn` over the validation pair in batches of `step`, eval mode, no gradients."""
    model.eval()
    xv, yv = validation
    with torch.no_grad(), autocast():
        total = sum(
            float(loss_fn(model(xv[j : j + step]).float(), yv[j : j + step])) * len(xv[j : j + step])
            for j in range(0, len(xv), step)
        )
    return total / max(len(xv), 1)


SINGLE_MACHINE_SOURCES = tuple(s for s, w in SYNTHETIC_WORKLOADS.items() if w.n_machines == 1)
"""Workloads defined on a one-machine cluster of their own (DeepRM's single pool): a placement learner has no
choice there, and on TVW-RL's 10 machines they would see a tenth of their load."""


def training_sources(have: Iterable[str], wanted: Sequence[str], exclude: Iterable[str] = ()) -> list[str]:
    """The sources a partition trains on: those of `have` (sources with training sequences) named in `wanted`, or
    when `wanted` is empty every one but `exclude`; sorted."""
    have = sorted(set(have))
    return [s for s in have if s in wanted] if wanted else [s for s in have if s not in set(exclude)]


def curve_frame(curve: Iterable[Mapping] | pl.DataFrame, source: str, load: int, seed: int) -> pl.DataFrame:
    """One training run's learning curve (the rows a trainer returns) with its source, load_pct and seed."""
    frame = curve if isinstance(curve, pl.DataFrame) else pl.DataFrame(list(curve))
    return frame.with_columns(
        source=pl.lit(source), load_pct=pl.lit(load, pl.Int32), seed=pl.lit(seed, pl.Int64)
    )


def stack_curves(frames: list[pl.DataFrame], schema: Mapping[str, pl.DataType]) -> pl.DataFrame:
    """The `curve_frame`s of a partition's runs as one table with exactly `schema`'s columns, in its order and
    types; a column no run reported is null (e.g. returns during Dejavu's pretraining)."""
    if not frames:
        raise ValueError("stack_curves: no learning curve to stack")
    out = pl.concat(frames, how="diagonal_relaxed")
    missing = [c for c in schema if c not in out.columns]
    out = out.with_columns([pl.lit(None, schema[c]).alias(c) for c in missing])
    return out.select([pl.col(c).cast(t) for c, t in schema.items()])


CURVE_CHECK_DOCS = {
    "learning_curve_is_finite": "Every training run of the partition has a learning curve (rows) and no NaN or "
    "infinite value in it (a diverged run's returns or losses are not finite).",
}
"""The check of a learning-curve table (`curve_check_values`): name -> what passing means."""


def curve_check_values(curve: pl.DataFrame) -> CheckValues:
    """Check name (CURVE_CHECK_DOCS) -> (passed, metadata) of the stacked learning curves of a partition: rows,
    every float column finite where reported (nulls, e.g. returns during pretraining, are not values)."""
    passed, meta = table_check(curve, unique=("source", "load_pct", "seed", "iteration"))
    runs = curve.select("source", "load_pct", "seed").unique().height if curve.height else 0
    return {"learning_curve_is_finite": (passed, {**meta, "n_runs": runs})}
