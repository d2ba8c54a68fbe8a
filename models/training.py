"""Pieces shared by the small torch models: seeded initialisation and the minibatch Adam loop."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn


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
) -> float:
    """Adam over `n_epochs` passes of shuffled minibatches (order drawn from `generator`); returns the mean
    loss of the last epoch (NaN when no epoch ran)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    epoch_loss = float("nan")
    for _ in range(n_epochs):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for start in range(0, len(order), batch_size):
            b = order[start : start + batch_size]
            loss = loss_fn(model(x[b]), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(b)
        epoch_loss = total / len(x)
    return epoch_loss
