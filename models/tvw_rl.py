"""TVW-RL's scheduler (AAAI 2021, "Implementation"): a policy network with one hidden layer of 20 ReLU units and a
softmax over the M machines (plus hold where the simulator allows it), masked to valid actions, trained with
REINFORCE and a time-dependent baseline (`models.reinforce`) on the training job sequences.

Run it without Dagster:

    from models.tvw_rl import TvwRlConfig, train_tvw_rl
    curve = train_tvw_rl(JobBatch.from_frame(train_rows), TvwRlConfig.short(), checkpoint_path="tvw.ckpt.pt")

`TvwRlConfig.paper()` is the paper's setup: M = 10, h = 20, d = 2, C = 8, K_c = 0.1, K_u = 3, K_o = 30000,
K_w = 50, Adam lr 0.001, N = 20 trajectories x 20 sequences per iteration, episodes of at most L = 200 steps,
2000 iterations. Choices the paper leaves open, ours: `jobs_per_episode` = 40 in `paper` (the paper: "a fixed
number of jobs arrive"; 40 of our sequences' jobs arrive well within L at every load; `short` takes 100, `study`
the whole sequence), hold only when no machine fits (the paper's action space is the M machines), advantages
normalised per iteration (see `models.reinforce`), the observation of `sim.observation` (predicted labels, the
trace's request, observed usage only).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn

from models.checkpoint import checkpoint_file, publish_trained
from models.forecaster import torch_threads
from models.reinforce import (
    ADVANTAGE_MODES,
    PolicyNet,
    ReinforceConfig,
    check_state_space,
    config_dict,
    draw_sequences,
    load_checkpoint,
    policy_payload,
    sample_masked,
    train_loop,
)
from models.training import SINGLE_MACHINE_SOURCES, training_sources
from sim.config import SimConfig
from sim.core import PENALTY_NAMES, State, action_mask, relabel
from sim.jobs import JobBatch
from sim.labelling import Labeller
from sim.observation import ObservationConfig, encode, n_features
from sim.rollout import RolloutBatch, rollout


@dataclass(frozen=True)
class TvwRlConfig:
    """Everything a TVW-RL training run depends on (stored in its checkpoints)."""

    sim: SimConfig = field(
        default_factory=lambda: SimConfig(max_steps=200, jobs_per_episode=40, hold_rule="no_fit")
    )
    """The simulator the agent trains in (TVW-RL's state space and penalty weights; L = 200)."""
    obs: ObservationConfig = field(default_factory=ObservationConfig)
    """What the agent sees (default: predicted labels, the trace's request, observed usage)."""
    reinforce: ReinforceConfig = field(default_factory=ReinforceConfig)
    hidden_units: int = 20
    """Units of the one hidden ReLU layer (TVW-RL: 20)."""

    @staticmethod
    def paper(seed: int = 0) -> TvwRlConfig:
        """The paper's configuration (2000 iterations of 20 x 20 trajectories)."""
        return TvwRlConfig(reinforce=ReinforceConfig(seed=seed))

    @staticmethod
    def short(seed: int = 0) -> TvwRlConfig:
        """The embedded sample's preset, about a minute per policy on 2 busy cores: 150 iterations of 10 sequences
        (the sample's whole training set per load, so the curve carries no draw noise) x 8 trajectories, episodes
        of the first 100 jobs of each sequence (safety cap 1000 steps), Adam lr 0.01, a discount of 0.95 per
        decision. 100 jobs fill the cluster to the sequence's load (40 jobs only ever saw a light cluster: the
        curve was flat, entropy 2.28 -> 2.25), at a quarter of a whole 80 % sequence's cost. Too short to
        converge; it learns visibly: on the sample's sequences (seed 0), the mean return of the last 10 % of
        iterations is 1-10 % above the first 10 % in all 9 (source, load) cells, 2.2-15 standard errors, most at
        30 % load and least at 80 %, where the no_fit hold rule forces overshoot whatever the agent learns."""
        return TvwRlConfig(
            sim=SimConfig(max_steps=1000, jobs_per_episode=100, hold_rule="no_fit"),
            reinforce=ReinforceConfig(
                learning_rate=0.01,
                discount=0.95,
                n_iterations=150,
                n_sequences=10,
                n_trajectories=8,
                checkpoint_every=25,
                seed=seed,
            ),
        )

    @staticmethod
    def study(seed: int = 0) -> TvwRlConfig:
        """What the README's results section measured: whole sequences per episode (every job of the 300-step
        arrival window, as the evaluation runs them; 40-job episodes only ever see a light cluster and the policy
        learnt there overshoots on full sequences), 10 sequences x 20 trajectories, Adam lr 0.01, a discount of
        0.95 per decision, 200 iterations."""
        return TvwRlConfig(
            sim=SimConfig(max_steps=1000, jobs_per_episode=None, hold_rule="no_fit"),
            reinforce=ReinforceConfig(
                learning_rate=0.01,
                discount=0.95,
                n_iterations=200,
                n_sequences=10,
                n_trajectories=20,
                checkpoint_every=25,
                seed=seed,
            ),
        )

    def with_sim(self, **changes) -> TvwRlConfig:
        """A copy with SimConfig fields changed (ablations: k_underutil, k_overshoot, noise_max_units, ...)."""
        return replace(self, sim=replace(self.sim, **changes))


TVW_RL_PRESETS = {"paper": TvwRlConfig.paper, "study": TvwRlConfig.study, "short": TvwRlConfig.short}
"""Named TVW-RL training presets: seed -> TvwRlConfig."""


@dataclass(frozen=True)
class TvwRlTrainConfig:
    """The TVW-RL training runs of one (load, seed): a named preset of `TvwRlConfig`, a few overrides, the sources."""

    preset: str = "paper"
    """'paper' (TVW-RL: 2000 iterations of 20 x 20), 'study' (200 iterations of 10 x 20 whole sequences, lr 0.01,
    gamma 0.95) or 'short' (the embedded sample's 150 iterations of 10 x 8, 100-job episodes)"""
    n_iterations: int = 0
    """override the preset's iterations (0 = keep)"""
    learning_rate: float = 0.0
    """override the preset's Adam learning rate (0 = keep)"""
    advantage: str = "normalise"
    """advantage scaling: normalise | scale | raw"""
    sources: tuple[str, ...] = ()
    """sources to train on (empty: every source with sequences)"""
    labels: str = "predicted"
    """EC labels the agent sees: predicted (Algorithm 1 classifier) | true"""

    def __post_init__(self) -> None:
        if self.preset not in TVW_RL_PRESETS:
            raise ValueError(f"unknown TVW-RL preset {self.preset!r}; known: {sorted(TVW_RL_PRESETS)}")
        if self.advantage not in ADVANTAGE_MODES:
            raise ValueError(f"advantage must be one of {ADVANTAGE_MODES}, got {self.advantage!r}")

    def run_config(self, seed: int, is_label_known: bool) -> TvwRlConfig:
        """The TvwRlConfig of a run with training seed `seed`: the preset's simulator and budget with the
        overrides, one hidden layer of 20 units. With `is_label_known` the agent sees the true job class
        (synthetic sources: it is known at arrival there, and no EC classifier exists; the ablations)."""
        base = TVW_RL_PRESETS[self.preset](seed)
        r = base.reinforce
        reinforce = replace(
            r,
            learning_rate=self.learning_rate or r.learning_rate,
            n_iterations=self.n_iterations or r.n_iterations,
            advantage=self.advantage,
            seed=seed,
        )
        labels = "true" if is_label_known else self.labels
        return TvwRlConfig(
            sim=base.sim, obs=ObservationConfig(labels=labels), reinforce=reinforce, hidden_units=20
        )

    def train_sources(self, have: list[str]) -> list[str]:
        """Sources of `have` to train on: those named, else all but the workloads of a single-machine cluster
        (DeepRM's: `models.training.SINGLE_MACHINE_SOURCES`; they train only when named)."""
        return training_sources(have, self.sources, SINGLE_MACHINE_SOURCES)


LEARNING_CURVE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "seed": pl.Int64,  # training seed
    "iteration": pl.Int64,
    "mean_return": pl.Float64,  # mean episode return over the iteration's B x N episodes (higher is better)
    "std_return": pl.Float64,
    "loss": pl.Float64,
    "entropy": pl.Float64,  # mean entropy of the masked policy over the iteration's decisions (nats)
    "n_truncated": pl.Int64,  # episodes that hit the safety cap
    "wall_s": pl.Float64,  # seconds the iteration took
    "cost_contention": pl.Float64,
    "cost_underutil": pl.Float64,
    "cost_overshoot": pl.Float64,
    "cost_wait": pl.Float64,
    "cost_unplaced": pl.Float64,
}
"""Columns of `rl__tvw_rl`: one row per (source, load, training seed, iteration)."""


def build_net(cfg: TvwRlConfig) -> PolicyNet:
    """The seeded, untrained network for `cfg`."""
    return PolicyNet(n_features(cfg.sim), cfg.sim.n_actions, cfg.hidden_units, cfg.reinforce.seed)


def make_act(
    net: nn.Module, greedy: bool = False
) -> Callable[[np.ndarray, np.ndarray, np.random.Generator], np.ndarray]:
    """The rollout's act function of `net`: sample (or argmax) the masked softmax, one thread, no grad; the
    forward pass runs on the device `net` lives on."""
    dev = next(net.parameters()).device

    def act(x: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        with torch_threads(1), torch.no_grad():
            logits = net(torch.from_numpy(x).to(dev)).cpu()
            return sample_masked(logits, mask, rng, greedy)

    return act


def greedy_hold_or_place(logits: torch.Tensor, mask: np.ndarray) -> np.ndarray:
    """(E,) the greedy decision of the masked softmax in two stages: hold when hold's probability exceeds that of
    placing at all (the sum over the valid machines), else the most probable valid machine. A plain argmax over the
    M + 1 actions compares hold with each machine alone: a policy that places with probability 0.7 spread over
    seven machines (0.1 each) and holds with 0.3 would hold for ever in a state that does not change. Under the
    "no_fit" rule hold is valid only when no machine is, so this equals the plain argmax there."""
    probs = torch.softmax(logits.masked_fill(~torch.from_numpy(mask), float("-inf")), dim=-1).numpy()
    place = probs[:, :-1]
    is_hold = probs[:, -1] > place.sum(axis=1)
    return np.where(is_hold, probs.shape[1] - 1, place.argmax(axis=1))


def penalty_means(batch: RolloutBatch) -> dict[str, float]:
    """Mean cost per component over the iteration's episodes (positive numbers, lower is better)."""
    return {f"cost_{n}": float(-batch.penalty_totals[:, i].mean()) for i, n in enumerate(PENALTY_NAMES)}


def train_tvw_rl(
    jobs: JobBatch,
    cfg: TvwRlConfig,
    labeller: Labeller | None = None,
    checkpoint_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """Train on the training sequences `jobs` (each iteration draws cfg.reinforce.n_sequences of them with
    replacement); returns the learning curve (one row per iteration: mean/std return, each cost, loss, entropy,
    wall seconds). `checkpoint_path` is the resumable checkpoint (`models.checkpoint.checkpoint_file` of the policy
    file), never the trained policy: training resumes from it when it exists and was written with the same
    configuration (logging "resuming tvw_rl from iteration N of M"); `models.reinforce.policy_payload` and
    `models.checkpoint.publish_policy` make the trained policy once training is done.
    Raises ValueError when `jobs` has no job, FloatingPointError on a non-finite return or loss."""
    if jobs.batch_size == 0 or int(jobs.n_jobs.sum()) == 0:
        raise ValueError("train_tvw_rl: the training sequences hold no job")
    net = build_net(cfg)
    r = cfg.reinforce

    def run_iteration(i: int, rng: np.random.Generator) -> RolloutBatch:
        rows = draw_sequences(rng, jobs.batch_size, r.n_sequences)
        return rollout(
            cfg.sim,
            cfg.obs,
            jobs.select(rows),
            r.n_trajectories,
            make_act(net),
            int(rng.integers(2**31)),
            labeller,
        )

    with torch_threads(1):
        return train_loop(
            net,
            run_iteration,
            r,
            config_dict(cfg.sim, cfg.obs, cfg.reinforce) | {"hidden_units": cfg.hidden_units},
            None if checkpoint_path is None else Path(checkpoint_path),
            log,
            penalty_means,
            name=TvwRlPolicy.name,
        )


def train_and_publish(
    jobs: JobBatch,
    cfg: TvwRlConfig,
    labeller: Labeller | None,
    policy_file: Path,
    run: tuple[str, int, int],
    revision: str,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """`train_tvw_rl` with the resumable checkpoint beside `policy_file` (`models.checkpoint.checkpoint_file`),
    then the trained policy published there with its sidecar (run = (source, load %, training seed), the
    configuration, git `revision`); returns the learning curve."""
    ckpt = checkpoint_file(policy_file)
    curve = train_tvw_rl(jobs, cfg, labeller, ckpt, log=log)
    config = config_dict(cfg.sim, cfg.obs, cfg.reinforce)
    publish_trained(policy_file, policy_payload(ckpt, TvwRlPolicy.name), *run, config, revision)
    return curve


def config_from_checkpoint(ckpt: dict) -> TvwRlConfig:
    """The TvwRlConfig a checkpoint was trained with."""
    c = ckpt["config"]
    sim = c["SimConfig"] | {"capacity_units": tuple(c["SimConfig"]["capacity_units"])}
    return TvwRlConfig(
        sim=SimConfig(**sim),
        obs=ObservationConfig(**c["ObservationConfig"]),
        reinforce=ReinforceConfig(**c["ReinforceConfig"]),
        hidden_units=int(c["hidden_units"]),
    )


STATE_SHAPE_FIELDS = ("n_machines", "capacity_units", "history_steps", "queue_size", "n_labels")
"""SimConfig fields that fix the network's input and output: evaluation must use the training values."""


class TvwRlPolicy:
    """TVW-RL's trained policy as a scheduler of the registry: greedy over the masked softmax
    (`greedy_hold_or_place`: hold only when holding is likelier than placing anywhere, else the likeliest machine).

    checkpoint: a trained policy file (`models.checkpoint.publish_policy`; the evaluation loads it through
    `models.checkpoint.check_trained`), a checkpoint written by `train_tvw_rl`, or None (the seeded untrained network of TvwRlConfig.short(),
    built for the SimConfig of the first `act`). labeller: sets the predicted labels before every decision when the
    policy's observation shows predicted labels and the state carries none (None: the clustering labels are
    shown instead, which the evaluation states in its results). The policy keeps its own hold rule (the one it
    was trained with) on top of the evaluation's mask."""

    name = "tvw_rl"

    def __init__(self, checkpoint: str | Path | None = None, labeller: Labeller | None = None) -> None:
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.labeller = labeller
        self.net: PolicyNet | None = None
        self.cfg: TvwRlConfig | None = None
        if self.checkpoint is not None:
            ckpt = load_checkpoint(self.checkpoint)
            self.cfg = config_from_checkpoint(ckpt)
            self.net = build_net(self.cfg)
            self.net.load_state_dict(ckpt["model"])

    def _ready(self, cfg: SimConfig) -> tuple[TvwRlConfig, PolicyNet]:
        if self.net is None:
            self.cfg = replace(TvwRlConfig.short(), sim=replace(cfg, hold_rule="no_fit"))
            self.net = build_net(self.cfg)
        check_state_space("tvw_rl", self.checkpoint, STATE_SHAPE_FIELDS, self.cfg.sim, cfg)
        return self.cfg, self.net

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        own, net = self._ready(cfg)
        obs = own.obs
        if obs.labels == "predicted" and state.obs_label is None:
            if self.labeller is not None:
                state = relabel(cfg, state, self.labeller.labels(cfg, state))
            else:
                obs = replace(obs, labels="true")
        mask = action_mask(cfg, state)
        if own.sim.hold_rule == "no_fit":
            mask[:, -1] = ~mask[:, :-1].any(axis=1)
        with torch_threads(1), torch.no_grad():
            logits = net(torch.from_numpy(encode(cfg, obs, state)))
            return greedy_hold_or_place(logits, mask).astype(np.int64)
