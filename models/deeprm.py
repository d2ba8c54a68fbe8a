"""DeepRM's own agent (Mao et al., HotNets 2016, sections 3-4) with the modifications TVW-RL made to use it as a
baseline (AAAI 2021, "Baselines"): a policy network that chooses WHICH waiting job goes next (or "void"), trained
with REINFORCE and DeepRM's time-dependent baseline (`models.reinforce`); the chosen job is placed by Best-Fit on
requests (`sim.policies._deeprm_act`, the rule of the DeepRM heuristics).

Run it without Dagster:

    from models.deeprm import DeepRMAgentConfig, train_deeprm, slowdown_vs_load
    curve = train_deeprm(JobBatch.from_frame(train_rows), DeepRMAgentConfig.short(), checkpoint_path="drm.pt")
    table, png = slowdown_vs_load(build_deeprm_sequences(DeepRMConfig()), "drm.pt")

State (`encode`, DeepRM section 3.2, Figure 2), a flat float32 vector in [0, 1], in this order (`feature_layout`):
- cluster (D, T, M x C)  DeepRM's cluster image on the MONOLITHIC pool (TVW-RL modification 2: capacity = M x C_d
                         units per resource): cell (d, tau, u) is 1 when u < the units of resource d committed at
                         t + tau by the PEAK requests of the jobs running now (TVW-RL modification 1: DeepRM plans
                         with a constant request per job; its requests are the job's peak usage). Background noise
                         and the real, time-varying usage are not shown: DeepRM does not know them. Cells are
                         occupancy (1/0), not one colour per job: DeepRM's colours only tell jobs apart, and with a
                         constant request per job the sum over a row is what it shows. Width M x max(C_d); cells at or
                         beyond M x C_d stay 0 for a smaller resource.
- slots (K, D, T, C)     the K visible queued jobs' images: cell (d, tau, u) is 1 when tau < the job's duration and
                         u < its request in d (peak usage). Width C_d, not M x C_d: no job's request exceeds one
                         machine (`sim.core.validate_jobs`), so the wider image would only add zeros. A duration
                         beyond T shows as T rows (DeepRM's durations are at most 15 < T = 20; long-running jobs of
                         real traces all look "at least T long": a limit of DeepRM's state, kept). Empty slots: 0.
- backlog (Bmax,)        DeepRM's backlog image, flattened: the first min(backlog, Bmax) cells are 1, where backlog =
                         waiting jobs beyond the K slots and Bmax = `backlog_size` (DeepRM: 60).
The image length T = `image_steps` (DeepRM: 20).

Actions: 0..K-1 = "schedule the job in visible slot k"; K = void. A slot is valid when it holds a waiting job that
fits some machine now (`sim.policies.queued_fits`: the simulator's placement rule and its request within the
machine's free capacity by requests); void is valid as in DeepRM except on an idle cluster with a job that fits,
or while a visible job that fits has waited `max_hold_steps` (T) steps or more (`slot_mask` says why), and, under
the simulator's hold_rule "no_fit", only when no slot is. The chosen job is moved to the queue head (`sim.policies.promote_queued_job`) and placed by
Best-Fit by requests; void holds (the simulator closes the step and time advances). Unlike DeepRM, a job starts
at once or not at all (the simulator has no reservations "in the first timestep the job fits till completion"),
so only jobs that fit now are valid, and an invalid choice is masked rather than treated as void.

Reward per decision (what its simulator call closed), `decision_rewards`:
    r = - sum over the closed steps s of sum_{j in system at s} 1 / T_j              (DeepRM's slowdown reward)
        + k_unused x P_U / mean_d(C_d)                                               (TVW-RL's extra penalty)
where a job is "in the system" at step s when arrival_j <= s < finish_j (waiting or running, as DeepRM), so the
first term summed over an episode is exactly minus the sum of job slowdowns (finish - arrival) / T_j (gamma = 1).
P_U is the simulator's own under-utilisation penalty of the closed steps (`info["penalty_underutil"]`,
-sum over used machines and resources of U^K_u, U the unused units incl. noise); with the agent's K_u = 1 (the
default of its SimConfig here) it is linear, "proportional to the number of total unused resources" as TVW-RL
states; dividing by C_d makes a wholly unused resource of one machine cost k_unused per step. k_unused = 1 is ours
(TVW-RL gives no value), on TVW-RL's baseline; DeepRM's own setup (its Figure 4) has k_unused = 0, DeepRM's reward. The simulator's other penalties (contention, overshoot, wait) are not DeepRM's reward and
are not used. When the safety cap truncates an episode, each job j never placed is charged
    1 + k_unused x T_j x sum_d C_d^K_u / mean_d(C_d)
(it would finish at least T_j after the cap, so its slowdown is at least what it has accrued + 1; and for each of
its T_j steps it could leave at most a whole machine unused, the simulator's own bound in
`sim.penalties.unplaced_charge`). With a charge of 1 alone, voiding until the cap paid: on the sample's DeepPlace
sequences (20-job episodes, cap 200) a policy that voids whenever it may scored -482 against -828 for one that
never voids, because truncation stopped the unused-resource penalty that running the jobs accrues.

Training (DeepRM Figure 3): per iteration, `n_sequences` jobsets x `n_trajectories` episodes in lock-step
(`rollout_deeprm`: the project's one rollout loop, `sim.rollout.rollout`, with DeepRM's hooks), returns-to-go
with gamma = 1, baseline = the mean return at the same decision index over the episodes of the same jobset, one
optimiser step (`models.reinforce.train_loop`, Adam as there; DeepRM used RMSProp with the same learning rate
0.001).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch
from scipy import stats
from torch import nn

from models.checkpoint import checkpoint_file, publish_trained
from models.reinforce import (
    PolicyNet,
    ReinforceConfig,
    check_state_space,
    config_dict,
    load_checkpoint,
    policy_payload,
    sample_masked,
    train_loop,
)
from models.training import training_sources
from pipelines.synthetic import DEEPRM_SOURCE, DeepRMConfig
from sim import core
from sim.config import SimConfig
from sim.core import State
from sim.jobs import JobBatch
from sim.penalties import unplaced_charge
from sim.policies import (
    Tetris,
    _deeprm_act,
    choose,
    free_by_requests,
    make_policy,
    play,
    promote_queued_job,
    queued_fits,
    valid_machines,
)
from sim.rollout import RolloutBatch, rollout

REWARD_COMPONENTS = ("slowdown", "unused", "unplaced")
"""Columns of `RolloutBatch.penalty_totals` in this module's rollouts (negative sums per episode): the slowdown
reward, the unused-resource penalty, the truncation charge of never-placed jobs."""

FIGURE4_POLICIES = ("deeprm_sjf", "deeprm_packer", "tetris")
"""Heuristics of the registry DeepRM's Figure 4 compares against (SJF, Packer, Tetris)."""

DEEPRM_BUDGETS = {
    "short": {"n_iterations": 60, "n_sequences": 8, "n_trajectories": 8, "checkpoint_every": 10},
    "sample": {"n_iterations": 15, "n_sequences": 4, "n_trajectories": 4, "checkpoint_every": 5},
}
"""Training budgets of the presets below "paper" (`DeepRMTrainConfig`): "short", a few minutes per source on 2
cores, still learning visibly; "sample", the embedded sample's run (a partition in about a minute on a quiet
2-core machine; a smoke run of the layer, not a trained agent worth comparing). DeepRM's Figure 4 trend needs
more: on its workload at 90 % load (seed 0, greedy, 30 test jobsets), 15 iterations of 4 x 4 (the sample) left
the agent at 3.2-4.4 (seeds 0-2), 200 of 8 x 8 at 1.99, 500 at 1.85, 1000 (7 min on 2 cores) at 1.65 +- 0.14,
below SJF's 1.84 +- 0.15 (`benchmarks/bench_deeprm.py --fig4-load`; `DeepRMTrainConfig.n_iterations`)."""

TETRIS_STAR_SHORT_JOB_WEIGHT = 1.0
"""Weight of the 1 / duration term of "tetris_star" (DeepRM's Tetris*: "balances preferences for short jobs and
resource packing in a combined score"; the weight is ours: 1 puts a 1-step job's bonus on the scale of the
alignment score, which is at most D). The registry's "tetris" has the term off (TVW-RL's Tetris), so on a single
pool it orders jobs exactly as Packer."""


@dataclass(frozen=True)
class DeepRMAgentConfig:
    """Everything a DeepRM training run depends on (stored in its checkpoints). Defaults: DeepRM's paper setup on
    its own synthetic workload (`pipelines.synthetic.DeepRMConfig`: the cluster is one pool = 1 machine of 8
    units per resource)."""

    sim: SimConfig = field(
        default_factory=lambda: SimConfig(
            n_machines=1, queue_size=10, max_steps=400, k_underutil=1.0, hold_rule="always"
        )
    )
    """The simulator the agent trains in: queue_size = K job slots (DeepRM: 10); k_underutil = 1 makes P_U the
    linear unused-resource penalty; hold_rule "always" is DeepRM's void action; max_steps a safety cap well
    beyond DeepRM's 50-step jobsets."""
    image_steps: int = 20
    """T: steps of the cluster and slot images (DeepRM: 20)."""
    backlog_size: int = 60
    """Bmax: cells of the backlog image (DeepRM: 60)."""
    hidden_units: int = 20
    """Units of the one fully connected hidden layer (DeepRM: 20)."""
    k_unused: float = 1.0
    """Weight of TVW-RL's extra penalty on unused resources (ours; TVW-RL gives no value). DeepRM's own setup
    (`paper`, `short`: the agent of its Figure 4) sets 0: DeepRM's reward is the slowdown alone ("to optimize
    average job slowdown"), and the penalty pays for packing now over withholding for short jobs. Measured
    (DeepRM's workload at 90 % load, 200 iterations of 8 x 8 episodes, greedy on 30 test jobsets, seeds 0 / 1):
    mean slowdown 1.99 +- 0.22 / 1.86 +- 0.16 with 0, 2.12 +- 0.24 / 2.00 +- 0.20 with 1 (SJF 1.84 +- 0.15)."""
    max_hold_steps: int | None = 20
    """Void is not offered while a visible job that fits now has waited this many steps or more since it arrived
    (None: DeepRM as published, void whenever a job runs). Ours, = T: DeepRM withholds a job to keep room for
    short jobs about to arrive (its Fig. 7), within its T-step look-ahead; its jobs last at most 15 < T steps.
    Without it, an undertrained greedy agent on long-running jobs (which run for hundreds of steps) voids while
    anything runs, so it runs one job at a time: with the sample preset, 41 of 135 test episodes of the sample
    hit the evaluation's 1000-step cap (`slot_mask`)."""
    reinforce: ReinforceConfig = field(
        default_factory=lambda: ReinforceConfig(n_iterations=1000, n_sequences=100, n_trajectories=20)
    )
    """DeepRM: 100 jobsets x N = 20 episodes per iteration, learning rate 0.001, 1000 iterations."""

    def __post_init__(self) -> None:
        if self.image_steps < 1 or self.backlog_size < 1 or self.hidden_units < 1:
            raise ValueError("image_steps, backlog_size and hidden_units must be >= 1")
        if not np.isfinite(self.k_unused) or self.k_unused < 0:
            raise ValueError(f"k_unused must be finite and >= 0, got {self.k_unused}")
        if self.max_hold_steps is not None and self.max_hold_steps < 1:
            raise ValueError(f"max_hold_steps must be >= 1 or None, got {self.max_hold_steps}")

    @staticmethod
    def paper() -> DeepRMAgentConfig:
        """DeepRM's configuration (1000 iterations of 100 jobsets x 20 episodes). One iteration holds about
        3 GB of features on its workload (measured: 620 MB for 20 x 20 episodes of about 115 decisions x 3580
        features, float32) and takes minutes on 2 cores (`benchmarks/bench_deeprm.py`): run it on a big machine.
        The reward is DeepRM's, the slowdown alone (k_unused = 0)."""
        return DeepRMAgentConfig(k_unused=0.0)

    @staticmethod
    def tvw_baseline(seed: int = 0) -> DeepRMAgentConfig:
        """TVW-RL's "DeepRM" baseline: TVW-RL's cluster (M = 10, C = 8, L = 200 with 40 jobs per episode, as
        `models.tvw_rl.TvwRlConfig`), DeepRM's agent, TVW-RL's batch (20 sequences x 20 trajectories)."""
        return DeepRMAgentConfig(
            sim=SimConfig(queue_size=10, max_steps=200, jobs_per_episode=40, k_underutil=1.0),
            reinforce=ReinforceConfig(n_iterations=2000, n_sequences=20, n_trajectories=20, seed=seed),
        )

    @staticmethod
    def short(seed: int = 0) -> DeepRMAgentConfig:
        """A few minutes on 2 cores: 60 iterations of 8 jobsets x 8 episodes, DeepRM's state, workload and
        reward (`paper`)."""
        return replace(
            DeepRMAgentConfig.paper(), reinforce=ReinforceConfig(**DEEPRM_BUDGETS["short"], seed=seed)
        )

    def with_sim(self, **changes) -> DeepRMAgentConfig:
        """A copy with SimConfig fields changed."""
        return replace(self, sim=replace(self.sim, **changes))

    @property
    def n_actions(self) -> int:
        """K + 1: a visible slot or void."""
        return self.sim.queue_size + 1


# state encoding


def feature_layout(cfg: DeepRMAgentConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of each block of `encode`'s vector, in order."""
    s = cfg.sim
    width = max(s.capacity_units)
    return {
        "cluster": (s.n_resources, cfg.image_steps, s.n_machines * width),
        "slots": (s.queue_size, s.n_resources, cfg.image_steps, width),
        "backlog": (cfg.backlog_size,),
    }


def n_features(cfg: DeepRMAgentConfig) -> int:
    """F: length of `encode`'s vector."""
    return int(sum(np.prod(shape) for shape in feature_layout(cfg).values()))


def committed_requests(state: State, horizon: int) -> np.ndarray:
    """(B, D, horizon) int64: units per resource of the whole cluster that the requests of the jobs running now
    hold at t, t+1, ..., t+horizon-1 (each job holds its request until it ends)."""
    n_envs, n_d = state.batch_size, state.jobs.n_resources
    bi, ji = np.nonzero(core.jobs_running(state))
    left = np.minimum(state.job_start[bi, ji] + state.jobs.duration[bi, ji] - state.t[bi], horizon)
    req = state.jobs.request[bi, ji].astype(np.int64)  # (N, D)
    # difference array over tau: +request at 0, -request at the job's end (or past the horizon)
    diff = np.zeros((n_envs, n_d, horizon + 1), dtype=np.int64)
    for d in range(n_d):
        np.add.at(diff[:, d], (bi, np.zeros_like(bi)), req[:, d])
        np.add.at(diff[:, d], (bi, left), -req[:, d])
    return np.cumsum(diff, axis=2)[:, :, :horizon]


def encode(cfg: DeepRMAgentConfig, state: State) -> np.ndarray:
    """(B, F) float32 in [0, 1]: the cluster image, the K slot images and the backlog (module docstring)."""
    s, horizon = cfg.sim, cfg.image_steps
    n_envs = state.batch_size
    layout = feature_layout(cfg)
    width = layout["slots"][-1]
    tau = np.arange(horizon)

    committed = committed_requests(state, horizon)  # (B, D, T)
    cells = np.arange(layout["cluster"][-1])
    cluster = cells[None, None, None, :] < committed[..., None]

    jobs_idx, request, fits = queued_fits(s, state)
    is_waiting = (state.next_job[:, None] + np.arange(s.queue_size)[None, :]) < state.n_arrived[:, None]
    is_waiting &= ~state.is_done[:, None]
    duration = state.jobs.duration[np.arange(n_envs)[:, None], jobs_idx] * is_waiting  # (B, K)
    rows_on = tau[None, None, :] < duration[..., None]  # (B, K, T)
    units_on = (
        np.arange(width)[None, None, None, :] < (request * is_waiting[..., None])[..., None]
    )  # (B,K,D,C)
    slots = rows_on[:, :, None, :, None] & units_on[:, :, :, None, :]

    backlog = np.maximum(core.queue_length(state) - s.queue_size, 0)
    backlog_cells = np.arange(cfg.backlog_size)[None, :] < backlog[:, None]

    out = np.concatenate(
        [cluster.reshape(n_envs, -1), slots.reshape(n_envs, -1), backlog_cells], axis=1
    ).astype(np.float32)
    out[state.is_done] = 0.0
    return out


def slot_mask(cfg: DeepRMAgentConfig, sim_cfg: SimConfig, state: State) -> np.ndarray:
    """(B, K + 1) bool: slots holding a waiting job that fits some machine now (`queued_fits`), and void: where no
    slot is valid, and under hold_rule "always" also where some job runs and no valid slot's job has waited
    cfg.max_hold_steps steps or more since its arrival. Done envs: only void.

    Void on an idle cluster (no job running) with a job that fits is not offered: DeepRM's state has no clock,
    so the image would stay the same until the next arrival and a greedy policy could hold for ever (measured:
    episodes truncated with jobs never placed); DeepRM's gains from holding (its Figure 7) come from keeping room
    while jobs run. The wait bound (`DeepRMAgentConfig.max_hold_steps`) closes the same trap on a busy cluster:
    a job that fits is withheld for at most that many steps, so a policy that prefers void still places every
    job and every episode ends (a greedy agent that voided while anything ran ran long-running jobs one at a
    time, past the safety cap)."""
    jobs_idx, _, fits = queued_fits(sim_cfg, state)
    mask = np.zeros((state.batch_size, cfg.n_actions), dtype=bool)
    mask[:, :-1] = fits.any(axis=2) & ~state.is_done[:, None]
    can_place = mask[:, :-1].any(axis=1)
    if sim_cfg.hold_rule == "always":
        may_hold = core.jobs_running(state).any(axis=1)
        if cfg.max_hold_steps is not None:
            waited = (
                state.t[:, None] - state.jobs.arrival_step[np.arange(state.batch_size)[:, None], jobs_idx]
            )
            may_hold &= ~(mask[:, :-1] & (waited >= cfg.max_hold_steps)).any(axis=1)
        mask[:, -1] = ~can_place | may_hold
    else:
        mask[:, -1] = ~can_place
    return mask


def machine_actions(sim_cfg: SimConfig, state: State, is_void: np.ndarray) -> np.ndarray:
    """(B,) simulator actions for a state whose head is the chosen job: hold (M) where `is_void`, else Best-Fit
    by requests (`sim.policies._deeprm_act`). Where the simulator forbids the hold (hold_rule "no_fit" with the
    head fitting by its own rule but not by requests), the Best-Fit machine among those the mask allows."""
    n_m = sim_cfg.n_machines
    actions = np.where(is_void, n_m, _deeprm_act(sim_cfg, state))
    must_place = (actions == n_m) & ~core.action_mask(sim_cfg, state)[:, n_m]
    if must_place.any():
        fallback = choose(-free_by_requests(sim_cfg, state).sum(axis=2), valid_machines(sim_cfg, state))
        actions = np.where(must_place, fallback, actions)
    return actions


# reward


def slowdown_accrued(state: State) -> np.ndarray:
    """(B,) float64: sum over jobs of (steps in the system before t) / T_j, where a job is in the system from its
    arrival until it finishes (start + T_j; never for a job not placed yet). Its increase over a simulator call is
    minus DeepRM's reward of the steps that call closed; at the end of an episode it is the sum of slowdowns."""
    jobs = state.jobs
    is_real = jobs.is_real
    finish = np.where(state.job_start >= 0, state.job_start + jobs.duration, np.iinfo(np.int64).max)
    steps = np.clip(np.minimum(state.t[:, None], finish) - jobs.arrival_step, 0, None) * is_real
    return (steps / np.maximum(jobs.duration, 1)).sum(axis=1)


def decision_rewards(
    cfg: DeepRMAgentConfig, before: State, after: State, info: dict[str, np.ndarray]
) -> np.ndarray:
    """(B, 3) reward components of one simulator call, REWARD_COMPONENTS order (module docstring)."""
    out = np.zeros((before.batch_size, len(REWARD_COMPONENTS)))
    out[:, 0] = -(slowdown_accrued(after) - slowdown_accrued(before))
    out[:, 1] = cfg.k_unused * info["penalty_underutil"] / float(np.mean(cfg.sim.capacity_units))
    is_cut = after.is_truncated & ~before.is_truncated
    if is_cut.any():
        jobs = after.jobs
        is_left = jobs.is_real & (after.job_start < 0)
        unused_bound = unplaced_charge(
            jobs.duration, cfg.sim.capacity_units, 0.0, cfg.sim.k_underutil, 0.0, 0.0
        )
        per_job = 1.0 + cfg.k_unused * unused_bound / float(np.mean(cfg.sim.capacity_units))
        out[:, 2] = -np.where(is_cut, (per_job * is_left).sum(axis=1), 0.0)
    return out


# network


DeepRMNet = PolicyNet
"""DeepRM's policy network: one fully connected hidden layer of 20 units over the state, K + 1 logits."""


def build_net(cfg: DeepRMAgentConfig) -> DeepRMNet:
    """The seeded, untrained network for `cfg`."""
    return DeepRMNet(n_features(cfg), cfg.n_actions, cfg.hidden_units, cfg.reinforce.seed)


def choose_slots(
    net: nn.Module, cfg: DeepRMAgentConfig, state: State, rng: np.random.Generator, greedy: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(features (B, F), mask (B, K + 1), action (B,)): the network's slot or void for every env, sampled from the
    masked softmax with `rng` or its argmax."""
    x = encode(cfg, state)
    mask = slot_mask(cfg, cfg.sim, state)
    with torch.no_grad():
        logits = net(torch.from_numpy(x))
    return x, mask, sample_masked(logits, mask, rng, greedy).astype(np.int64)


def apply_choice(cfg: DeepRMAgentConfig, state: State, action: np.ndarray) -> tuple[State, np.ndarray]:
    """(state with the chosen jobs at the head, simulator actions) for actions in 0..K (K = void)."""
    k = cfg.sim.queue_size
    is_void = (action == k) | state.is_done
    state = promote_queued_job(state, np.where(is_void, 0, action))
    return state, machine_actions(cfg.sim, state, is_void)


# training


def rollout_hooks(cfg: DeepRMAgentConfig) -> dict[str, Callable]:
    """DeepRM's view, action space and reward as `sim.rollout.rollout`'s hooks: the image state (`encode`), the
    slot mask (`slot_mask`), the chosen job moved to the head and placed by Best-Fit (`apply_choice`), the reward
    components REWARD_COMPONENTS (`decision_rewards`)."""

    def encoder(state: State) -> np.ndarray:
        return encode(cfg, state)

    def mask_fn(state: State) -> np.ndarray:
        return slot_mask(cfg, cfg.sim, state)

    def apply_fn(state: State, action: np.ndarray) -> tuple[State, np.ndarray]:
        return apply_choice(cfg, state, action)

    def reward_fn(before: State, after: State, reward: np.ndarray, info: dict[str, np.ndarray]) -> np.ndarray:
        return decision_rewards(cfg, before, after, info)

    return {"encoder": encoder, "mask_fn": mask_fn, "apply_fn": apply_fn, "reward_fn": reward_fn}


def rollout_deeprm(
    net: nn.Module,
    cfg: DeepRMAgentConfig,
    jobs: JobBatch,
    n_trajectories: int,
    seed: int,
    greedy: bool = False,
    timings: dict[str, float] | None = None,
) -> RolloutBatch:
    """The policy over B = jobs.batch_size jobsets x n_trajectories episodes in lock-step (env b * N + n is
    episode n of jobset b), one decision per env per round until every env is done: `sim.rollout.rollout` with
    DeepRM's hooks (`rollout_hooks`), the network's slot or void sampled from its masked softmax (or its argmax
    when `greedy`). Rewards are the sum of `decision_rewards`; `penalty_totals` holds REWARD_COMPONENTS per env.
    Seeds of the envs and the sampling draw from default_rng(seed). `timings` as `sim.rollout.rollout`'s."""

    def act(x: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        with torch.no_grad():
            logits = net(torch.from_numpy(x))
        return sample_masked(logits, mask, rng, greedy)

    return rollout(cfg.sim, None, jobs, n_trajectories, act, seed, timings=timings, **rollout_hooks(cfg))


def checkpoint_config(cfg: DeepRMAgentConfig) -> dict:
    """The plain dict stored in (and checked against) a checkpoint."""
    return config_dict(cfg.sim, cfg.reinforce) | {
        "agent": "deeprm",
        "image_steps": cfg.image_steps,
        "backlog_size": cfg.backlog_size,
        "hidden_units": cfg.hidden_units,
        "k_unused": cfg.k_unused,
        "max_hold_steps": cfg.max_hold_steps,
    }


def config_from_checkpoint(ckpt: dict, path: Path | str = "?") -> DeepRMAgentConfig:
    """The DeepRMAgentConfig a checkpoint was trained with (ValueError naming the file when it is not DeepRM's)."""
    c = ckpt["config"]
    if c.get("agent") != "deeprm":
        raise ValueError(f"checkpoint {path} is not a DeepRM agent's (agent {c.get('agent')!r})")
    sim = c["SimConfig"] | {"capacity_units": tuple(c["SimConfig"]["capacity_units"])}
    return DeepRMAgentConfig(
        sim=SimConfig(**sim),
        image_steps=int(c["image_steps"]),
        backlog_size=int(c["backlog_size"]),
        hidden_units=int(c["hidden_units"]),
        k_unused=float(c["k_unused"]),
        # checkpoints from before the wait bound were trained without it: they run as they were trained
        max_hold_steps=c.get("max_hold_steps"),
        reinforce=ReinforceConfig(**c["ReinforceConfig"]),
    )


def train_deeprm(
    jobs: JobBatch,
    cfg: DeepRMAgentConfig,
    checkpoint_path: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """Train on the jobsets `jobs` (each iteration draws cfg.reinforce.n_sequences of them with replacement);
    returns the learning curve (one row per iteration: mean/std return, mean slowdown per job, each reward
    component, loss, entropy, wall seconds). `checkpoint_path` is the resumable checkpoint, never the trained
    policy: training resumes from it when it exists and was written with the same configuration (else a clear
    error), logging "resuming deeprm_rl from iteration N of M"; `models.reinforce.policy_payload` and
    `models.checkpoint.publish_policy` make the trained policy once training is done. Raises ValueError when `jobs` holds no job, FloatingPointError on
    a non-finite return or loss."""
    if jobs.batch_size == 0 or int(jobs.n_jobs.sum()) == 0:
        raise ValueError("train_deeprm: the training jobsets hold no job")
    net = build_net(cfg)
    r = cfg.reinforce
    n_jobs_of_batch: dict[int, np.ndarray] = {}

    def run_iteration(i: int, rng: np.random.Generator) -> RolloutBatch:
        rows = rng.integers(0, jobs.batch_size, size=r.n_sequences)
        picked = jobs.select(rows)
        n_jobs = (
            picked.n_jobs
            if cfg.sim.jobs_per_episode is None
            else picked.first_jobs(cfg.sim.jobs_per_episode).n_jobs
        )
        n_jobs_of_batch["current"] = np.repeat(n_jobs, r.n_trajectories)
        return rollout_deeprm(net, cfg, picked, r.n_trajectories, int(rng.integers(2**31)))

    def curve_extra(batch: RolloutBatch) -> dict[str, float]:
        n_jobs = np.maximum(n_jobs_of_batch["current"], 1)
        out = {"mean_slowdown": float((-batch.penalty_totals[:, 0] / n_jobs).mean())}
        out |= {
            f"cost_{n}": float(-batch.penalty_totals[:, i].mean()) for i, n in enumerate(REWARD_COMPONENTS)
        }
        return out

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny net: more threads only add overhead
    try:
        return train_loop(
            net,
            run_iteration,
            r,
            checkpoint_config(cfg),
            None if checkpoint_path is None else Path(checkpoint_path),
            log,
            curve_extra,
            name=DeepRMAgentPolicy.name,
        )
    finally:
        torch.set_num_threads(before)


# the scheduler of the registry


def train_and_publish(
    jobs: JobBatch,
    cfg: DeepRMAgentConfig,
    policy_file: Path,
    run: tuple[str, int, int],
    revision: str,
    log: Callable[[str], None] | None = None,
) -> list[dict]:
    """`train_deeprm` with the resumable checkpoint beside `policy_file` (`models.checkpoint.checkpoint_file`),
    then the trained policy published there with its sidecar (run = (source, load %, training seed), the
    configuration, git `revision`); returns the learning curve."""
    ckpt = checkpoint_file(policy_file)
    curve = train_deeprm(jobs, cfg, ckpt, log=log)
    payload = policy_payload(ckpt, DeepRMAgentPolicy.name)
    publish_trained(policy_file, payload, *run, checkpoint_config(cfg), revision)
    return curve


STATE_SHAPE_FIELDS = ("n_machines", "capacity_units")
"""SimConfig fields that fix the cluster image: evaluation must use the training values. The number of job slots
K is the agent's own (its checkpoint's queue_size), whatever the evaluation's queue_size."""


class DeepRMAgentPolicy:
    """DeepRM's trained agent as a scheduler of the registry (a `sim.policies.JobPicker`): `pick_job` is the
    network's greedy slot (the head, 0, when it chooses void); `act` places the head by Best-Fit on requests, or
    holds where `pick_job` chose void on that state. Called without `pick_job` on a state, `act` holds where the
    network's greedy choice there is void and otherwise places the head.

    The agent sees and chooses among its own K = queue_size job slots (those it was trained with), under the
    evaluation's placement rule, hold rule and cluster; `pick_job` returns a slot in 0..K-1.

    checkpoint: a trained policy file (`models.checkpoint.publish_policy`), a checkpoint written by
    `train_deeprm`, or None (the seeded untrained network of
    DeepRMAgentConfig.short() for the SimConfig of the first call)."""

    name = "deeprm_rl"

    def __init__(self, checkpoint: str | Path | None = None) -> None:
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.cfg: DeepRMAgentConfig | None = None
        self.net: DeepRMNet | None = None
        self._pending: tuple[tuple, np.ndarray] | None = None
        if self.checkpoint is not None:
            ckpt = load_checkpoint(self.checkpoint)
            self.cfg = config_from_checkpoint(ckpt, self.checkpoint)
            self.net = build_net(self.cfg)
            self.net.load_state_dict(ckpt["model"])

    def _ready(self, cfg: SimConfig) -> tuple[DeepRMAgentConfig, DeepRMNet]:
        if self.net is None:
            self.cfg = replace(DeepRMAgentConfig.short(), sim=cfg)
            self.net = build_net(self.cfg)
        check_state_space("deeprm_rl", self.checkpoint, STATE_SHAPE_FIELDS, self.cfg.sim, cfg)
        return self.cfg, self.net

    def _greedy(self, cfg: SimConfig, state: State) -> np.ndarray:
        own, net = self._ready(cfg)
        x = encode(own, state)
        mask = slot_mask(own, replace(cfg, queue_size=own.sim.queue_size), state)
        before = torch.get_num_threads()
        torch.set_num_threads(1)  # a tiny net: more threads only add wake-ups
        try:
            with torch.no_grad():
                logits = net(torch.from_numpy(x)).numpy()
        finally:
            torch.set_num_threads(before)
        # the argmax of the masked softmax (ties to the lowest index, as there)
        return np.where(mask, logits, -np.inf).argmax(axis=1).astype(np.int64)

    @staticmethod
    def _key(state: State) -> tuple:
        """What promoting a visible job leaves unchanged: time, queue range and batch size."""
        return (state.t.tobytes(), state.next_job.tobytes(), state.n_arrived.tobytes())

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        action = self._greedy(cfg, state)
        self._pending = (self._key(state), action)
        return np.where(action == self.cfg.sim.queue_size, 0, action)

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        pending, self._pending = self._pending, None
        if pending is not None and pending[0] == self._key(state):
            action = pending[1]
        else:
            action = self._greedy(cfg, state)
        return machine_actions(cfg, state, (action == self.cfg.sim.queue_size) | state.is_done)


@dataclass(frozen=True)
class RandomSlot:
    """A uniformly random visible job among those that fit some machine (never void unless none fits), placed by
    Best-Fit on requests: the untrained-agent reference of DeepRM Figure 6 ("no better than random")."""

    name: str = "random_slot"

    def pick_job(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        _, _, fits = queued_fits(cfg, state)
        ok = fits.any(axis=2)
        score = np.where(ok, rng.random(ok.shape), -1.0)
        return np.where(ok.any(axis=1), score.argmax(axis=1), 0)

    def act(self, cfg: SimConfig, state: State, rng: np.random.Generator) -> np.ndarray:
        return machine_actions(cfg, state, state.is_done)


# DeepRM Figure 4: slowdown vs load


def job_slowdowns(policy, cfg: SimConfig, jobs: JobBatch, seed: int) -> tuple[np.ndarray, int]:
    """(slowdown (finish - arrival) / duration of every placed job, jobs never placed) of `policy` over the
    jobsets `jobs` (run through `sim.policies.decide`, so a JobPicker's choice of job is honoured)."""
    slowdown, _, n_unplaced = _run_slowdowns(policy, cfg, jobs, seed)
    return slowdown, n_unplaced


def _run_slowdowns(policy, cfg: SimConfig, jobs: JobBatch, seed: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(slowdown of every placed job, its jobset's index, jobs never placed) of `policy` over `jobs`."""
    # the episodes' jobs: `core.reset` keeps the first jobs_per_episode
    n_jobs = jobs.max_jobs if cfg.jobs_per_episode is None else min(jobs.max_jobs, cfg.jobs_per_episode)
    limit = int(n_jobs + cfg.max_steps + 1)
    state = play(policy, cfg, jobs, seed, max_decisions=limit)
    if not state.is_done.all():
        raise RuntimeError(f"policy {policy.name!r}: episodes not finished after {limit} decisions")
    j = state.jobs
    is_real = j.is_real
    is_placed = is_real & (state.job_start >= 0)
    finish = state.job_start + j.duration
    slowdown = (finish - j.arrival_step)[is_placed] / j.duration[is_placed]
    env = np.broadcast_to(np.arange(j.batch_size)[:, None], is_placed.shape)[is_placed]
    return slowdown, env, int((is_real & ~is_placed).sum())


def nearest_load(load_pct: int, trained: Sequence[int]) -> int:
    """The training load closest to `load_pct` (ties to the lower one)."""
    if not trained:
        raise ValueError("nearest_load: no trained load given")
    return min(sorted(trained), key=lambda t: abs(t - load_pct))


def slowdown_vs_load(
    sequences: pl.DataFrame,
    checkpoint_path: str | Path | Mapping[int, str | Path],
    policies: Sequence[str] = FIGURE4_POLICIES,
    split: str = "test",
    seed: int = 0,
    include_random: bool = True,
    include_tetris_star: bool = True,
) -> tuple[pl.DataFrame, bytes]:
    """DeepRM Figure 4: mean job slowdown per load for the trained agent, the registry's heuristics `policies`,
    (include_tetris_star) DeepRM's Tetris* ("tetris_star": `sim.policies.Tetris` with
    TETRIS_STAR_SHORT_JOB_WEIGHT) and (include_random) `RandomSlot`, on the `split` jobsets of `sequences` (a
    `sim__job_sequences` frame, e.g. `build_deeprm_sequences`), in the simulator the agent was trained in.

    checkpoint_path: one checkpoint for every load, or {training load %: checkpoint}; DeepRM trains one agent per
    load (its Fig. 6 is "training DeepRM ... at a load of 70 %"), so each load uses the agent trained at the
    nearest training load (`trained_at_load_pct`). Every checkpoint must share one simulator (ValueError naming
    the odd one).

    Returns (table, PNG bytes). Table: one row per (load_pct, policy) with n_sequences, n_jobs, mean_slowdown
    (DeepRM's "average over experiments": the mean over jobsets of each jobset's mean slowdown over its placed
    jobs), slowdown_ci95 (half-width of its 95 % t-interval over jobsets), n_unplaced, trained_at_load_pct (the
    agent's row; null for the others)."""
    frame = sequences.filter(pl.col("split") == split)
    if frame.height == 0:
        raise ValueError(f"slowdown_vs_load: no job sequences for split {split!r}")
    paths = dict(checkpoint_path) if isinstance(checkpoint_path, Mapping) else {-1: checkpoint_path}
    if not paths:
        raise ValueError("slowdown_vs_load: no checkpoint given")
    agents = {load: DeepRMAgentPolicy(path) for load, path in paths.items()}
    sim_cfg = next(iter(agents.values())).cfg.sim
    for load, agent in agents.items():
        if agent.cfg.sim != sim_cfg:
            raise ValueError(
                f"slowdown_vs_load: checkpoint {agent.checkpoint} (load {load} %) was trained in another "
                f"simulator than {next(iter(agents.values())).checkpoint}"
            )
    named = [(n, make_policy(n)) for n in policies]
    if include_tetris_star:
        named.append(
            ("tetris_star", Tetris(short_job_weight=TETRIS_STAR_SHORT_JOB_WEIGHT, name="tetris_star"))
        )
    if include_random:
        named.append(("random_slot", RandomSlot()))
    rows = []
    for (load,), group in frame.group_by("load_pct", maintain_order=True):
        jobs = JobBatch.from_frame(group)
        trained_at = -1 if -1 in agents else nearest_load(int(load), list(agents))
        runs = [(DeepRMAgentPolicy.name, agents[trained_at], trained_at)] + [(n, p, None) for n, p in named]
        for name, policy, trained in runs:
            slow, env, n_unplaced = _run_slowdowns(policy, sim_cfg, jobs, seed)
            mean, half = _mean_over_jobsets(slow, env, jobs.batch_size)
            rows.append(
                {
                    "load_pct": int(load),
                    "policy": name,
                    "n_sequences": jobs.batch_size,
                    "n_jobs": int(slow.size + n_unplaced),
                    "mean_slowdown": mean,
                    "slowdown_ci95": half,
                    "n_unplaced": n_unplaced,
                    "trained_at_load_pct": None if trained is None or trained < 0 else int(trained),
                }
            )
    table = pl.DataFrame(rows, schema_overrides={"trained_at_load_pct": pl.Int64}).sort("load_pct", "policy")
    return table, plot_slowdown_vs_load(table)


def _mean_over_jobsets(slowdown: np.ndarray, env: np.ndarray, n_envs: int) -> tuple[float, float]:
    """(mean over jobsets with a placed job of their mean slowdown, half-width of its 95 % t-interval)."""
    count = np.bincount(env, minlength=n_envs)
    per_set = np.bincount(env, weights=slowdown, minlength=n_envs)[count > 0] / count[count > 0]
    if per_set.size == 0:
        return float("nan"), float("nan")
    if per_set.size == 1:
        return float(per_set[0]), float("nan")
    half = stats.t.ppf(0.975, per_set.size - 1) * per_set.std(ddof=1) / np.sqrt(per_set.size)
    return float(per_set.mean()), float(half)


def plot_slowdown_vs_load(table: pl.DataFrame) -> bytes:
    """PNG of mean job slowdown vs load, one line per policy (DeepRM Figure 4)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4))
    for (name,), part in table.sort("load_pct").group_by("policy", maintain_order=True):
        ax.errorbar(
            part["load_pct"].to_numpy(),
            part["mean_slowdown"].to_numpy(),
            yerr=part["slowdown_ci95"].to_numpy(),
            marker="o",
            capsize=3,
            label=name,
        )
    ax.set_xlabel("offered load (%)")
    ax.set_ylabel("average job slowdown")
    ax.set_title("Job slowdown at different loads (DeepRM Fig. 4)")
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


# --- the training and Figure 4 runs of the assets


@dataclass(frozen=True)
class DeepRMTrainConfig:
    """The DeepRM agent's training runs of one (load, seed): TVW-RL's "DeepRM" baseline (`tvw_baseline`: TVW-RL's
    10-machine cluster) on every source but DeepRM's own workload, where it is DeepRM's own setup (one pool of 8
    units per resource), the agent of DeepRM's Figure 4."""

    preset: str = "paper"
    """'paper' (DeepRM: 1000 iterations of 100 x 20; TVW-RL's baseline: 2000 of 20 x 20), 'short' or 'sample'"""
    n_iterations: int = 0
    """override the preset's iterations (0 = keep)"""
    sources: tuple[str, ...] = ()
    """sources to train on (empty: every source with sequences)"""

    def __post_init__(self) -> None:
        if self.preset not in ("paper", *DEEPRM_BUDGETS):
            raise ValueError(
                f"rl__deeprm: unknown preset {self.preset!r}; known: {('paper', *DEEPRM_BUDGETS)}"
            )

    def train_sources(self, have: Sequence[str]) -> list[str]:
        return training_sources(have, self.sources)

    def agent_config(self, source: str, seed: int) -> DeepRMAgentConfig:
        """The agent trained on `source`: DeepRM's own setup on its synthetic workload, TVW-RL's baseline (10
        machines, 40 jobs per episode; 20 in the presets below "paper") elsewhere."""
        if source == DEEPRM_SOURCE:
            base = DeepRMAgentConfig.paper() if self.preset == "paper" else DeepRMAgentConfig.short(seed)
        else:
            base = DeepRMAgentConfig.tvw_baseline(seed)
            if self.preset != "paper":
                base = base.with_sim(jobs_per_episode=20)
        r = replace(base.reinforce, **DEEPRM_BUDGETS.get(self.preset, {}))
        r = replace(r, seed=seed, n_iterations=self.n_iterations or r.n_iterations)
        return replace(base, reinforce=r)


DEEPRM_CURVE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "seed": pl.Int64,  # training seed
    "iteration": pl.Int64,
    "mean_return": pl.Float64,  # mean episode return (negative slowdown and unused-resource cost; higher is better)
    "std_return": pl.Float64,
    "mean_slowdown": pl.Float64,  # mean over episodes of total slowdown / jobs
    "cost_slowdown": pl.Float64,  # the reward's components as positive costs (REWARD_COMPONENTS)
    "cost_unused": pl.Float64,
    "cost_unplaced": pl.Float64,
    "loss": pl.Float64,
    "entropy": pl.Float64,  # mean entropy of the masked policy (nats)
    "n_truncated": pl.Int64,  # episodes that hit the safety cap
    "wall_s": pl.Float64,  # seconds the iteration took
}
"""Columns of `rl__deeprm`: one row per (source, load, training seed, iteration)."""

FIG4_SOURCE = DEEPRM_SOURCE
"""DeepRM's Figure 4 is on DeepRM's own synthetic workload."""

FIG4_TABLE = {
    "load_pct": pl.Int32,
    "policy": pl.String,
    "n_sequences": pl.Int64,  # test jobsets at the load
    "n_jobs": pl.Int64,
    "mean_slowdown": pl.Float64,  # mean over jobsets of the jobset's mean job slowdown (1 = no wait)
    "slowdown_ci95": pl.Float64,  # half-width of its 95 % t-interval over jobsets
    "n_unplaced": pl.Int64,  # jobs never placed (0 unless the safety cap cut an episode)
    "trained_at_load_pct": pl.Int64,  # the DeepRM agent's training load (null for the heuristics)
}
"""Columns of `eval__deeprm_fig4`: one row per (load, policy)."""


@dataclass(frozen=True)
class DeepRMFig4Config:
    """DeepRM's Figure 4: the loads, test jobsets and seeds, and which trained agent."""

    loads_pct: tuple[int, ...] = (30, 50, 70, 90)
    """offered loads of the figure, % (DeepRM: 10-190 %; its workload generator reaches 92 %)"""
    n_test_sequences: int = 30
    """test jobsets per load (DeepRM: 100)"""
    sequence_seed: int = 0
    """seed of the jobsets (sim__job_sequences' seed: the same test jobsets at its loads)"""
    training_seed: int = 0
    """training seed of the DeepRM agent evaluated"""
    seed: int = 0
    """simulator and tie-break seed of the test episodes"""

    def sequence_plan(self) -> DeepRMConfig:
        """The jobsets of the figure (`pipelines.synthetic.build_deeprm_sequences`): test jobsets only."""
        return DeepRMConfig(
            n_train_sequences=0,
            n_test_sequences=self.n_test_sequences,
            loads_pct=tuple(self.loads_pct),
            seed=self.sequence_seed,
        )


def trained_by_load(folder: Path, training_seed: int) -> dict[int, Path]:
    """{training load %: trained policy file} of the files `load<L>-seed<training_seed>.pt` in `folder`."""
    found = sorted(Path(folder).glob(f"load*-seed{training_seed}.pt"))
    return {int(p.stem.split("-")[0].removeprefix("load")): p for p in found}
