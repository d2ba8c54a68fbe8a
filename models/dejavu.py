"""Dejavu (DQfD with selective demonstrations and a competitive reward) as a scheduler of the batched simulator.

Dejavu (paper 003, sections III-IV) is a DQN with a target network (III-C), pretrained on demonstrations of a
heuristic scheduler (the kube-scheduler's default scoring, `sim.policies.KubeDefault`) with the DQfD loss (III-D-1,
Eq. 9-11), the demonstrations collected selectively by cosine similarity (Algorithm 3, III-D-2, a 5 % threshold),
then trained online (III-D-3) with the competitive reward (Algorithm 2): at every decision the baseline decides on a
copy of the environment (the simulator's `step` is pure, so the copy is the same `State`), both outcomes are scored
by the factors of Algorithm 1 and the reward compares them.

What the agent sees and does
- Input (`DejavuConfig.state`): by default the paper's state (Eq. 5): each node's available share of CPU and
  memory by requests and the pending pod's request. Alternatively ("encode"): `sim.observation.encode` (flat features in [0, 1]) with `ObservationConfig(labels="true",
  queue_request=DejavuConfig.queue_request)`. `encode` shows `sim.core.observed_labels(state)`: the labels a
  labeller put into the state when one did (`sim.core.relabel`), else the jobs' own labels (the synthetic
  workloads' classes are known at arrival). labels="true" only lifts `encode`'s guard against a state that no
  labeller touched; it never replaces predicted labels by true ones. (The paper's own state, Eq. 1-5, is the free
  CPU/memory of every node plus the pending pod's quota: the `history` block's last column and the queue block
  carry that information, with more history.)
  With `is_node_requests_shown` (default) each node's requested share follows (`agent_features`): the paper's
  node state by quota (Eq. 3), which `encode`'s observed-usage history does not give.
- Actions: 0..M-1 place the queue head on that machine, M holds (the paper's "inaction", Eq. 6); Q values of
  actions masked by `sim.core.action_mask` are never chosen (greedy and exploration alike) and never maximised
  over in the targets or the margin loss.

Reward (Algorithm 1 factors, Algorithm 2 competition). The outcome S' of an action a taken in state S is the
cluster right after it, at the same step (`utilisation_after`): the node utilisation
u_m,d = min((requests of the jobs running on m now + the head's request if a places it on m) / C_d, 1), the
Kubernetes view of a node (Eq. 3: its available resources are 1 - u), by requests as the kube-scheduler accounts
them. (The simulator's step also advances time to the next decision; jobs ending meanwhile would make both
outcomes depend on when the next job arrives rather than on the decision, so we score the cluster at the decision.)
- RBD1(S') = sqrt(sigma_cpu^2 + sigma_mem^2), sigma_d the population standard deviation of u_m,d over the n = M
  nodes (Algorithm 1 lines 10-16; its line 13 writes the variance but names it Std and the text calls it "the
  standard deviation of each resource", which is what we take). Lower is more balanced across nodes.
- RBD2(S', a) = |u_a,cpu - u_a,mem| on the chosen node (line 18), 0 for a hold (no node was chosen).
  Lower is more balanced within the node.
- PWD (line 20) = -1 if the placement failed (the head's request does not fit the chosen machine's free capacity by
  requests: kube's NodeResourcesFit, which the simulator's mask does not enforce), -1 if the agent held while some
  machine could take the head (mask and requests: is_idle), else 0.
- Competitive reward (Algorithm 2 with Algorithm 1's weights, line 21), the baseline kube_default deciding a_base
  on the same State (the copy of the environment: `sim.core.step` is pure, so S itself is the copy):
      r = alpha * (RBD1(S'_base) - RBD1(S'_rl)) + beta * (RBD2(S'_base, a_base) - RBD2(S'_rl, a_rl)) + gamma * PWD
  Algorithm 2 lines 12-13 write abs() of the differences, which pays any departure from the baseline, better or
  worse alike; we keep the sign, so the reward is positive when the agent leaves the cluster more balanced than the
  baseline would have, negative when less (the paper's stated aim: "outperform the existing heuristic").

Demonstrations (III-D-1, Eq. 7-8; Algorithm 3). kube_default runs lock-step episodes on the training sequences
(its rewards are the same competitive reward, against a second kube_default draw on the copy). Selection: a
candidate (s, a) is kept unless some already kept demonstration (s_k, a_k) has cos(s, s_k) >= 1 - threshold
(threshold 0.05) and, with `is_action_aware_selection` (Algorithm 3 lines 10-11: similar states with different
decisions are kept), the same action a_k = a. Algorithm 3 compares a candidate with the last kept one; we compare
with every kept one (a stricter filter of near-duplicates). Selection only decides which transitions are sampled:
n-step returns and next states come from the full demonstrator trajectory.

Loss (DQfD, Eq. 11): J = J_DQ + lambda_1 J_n + lambda_2 J_E + lambda_3 J_L2 with
- J_DQ: Huber(Q(s, a) - (r + gamma_d Q'(s', argmax_{a' valid} Q(s', a')))) (1-step double Q-learning, target net Q');
- J_n: the same with the n-step return r_t + ... + gamma_d^(n-1) r_{t+n-1} + gamma_d^n Q'(s_{t+n}, argmax Q(s_{t+n}))
  (Eq. 10, n = 10, double-Q bootstrap; the bootstrap is dropped where the episode ended before t + n);
- J_E = max_{a valid} [Q(s, a) + l(a_E, a)] - Q(s, a_E), l = margin for a != a_E, 0 otherwise (Eq. 9), on
  demonstration samples only;
- J_L2 = sum of squares of every weight and bias.
Q network: a fully connected network f plus, by default, a fixed prior that ranks the actions as kube_default does
(`DejavuConfig.demonstrator_prior`, `KubePrior`; not in the paper): f's output layer starts at zero, so the agent
starts as its demonstrator and the loss above moves it away from it (without the prior, the sample preset's short
pretraining left the agent below its demonstrator in 8 of the sample's 9 (source, load) cells).
Pretraining samples demonstrations only; RL samples uniformly from the demonstrations (never overwritten, as in
DQfD) and the agent's replay (a FIFO of `replay_capacity` decisions). The target network copies the online one
every `target_update_every` gradient steps. DQfD's prioritised replay is not implemented (uniform sampling).

Iterations: iteration i < n_pretrain_iterations does `updates_per_iteration` pretraining updates; later iterations
roll `episodes_per_iteration` training sequences with epsilon-greedy actions, append them to the replay and do
`updates_per_iteration` updates. Checkpoints (`save_checkpoint`) hold the state dicts, the optimiser, both
generators, the replay, the learning curve, the config and the iteration; `train` resumes from the latest one in
its folder and reaches the same final weights as an uninterrupted run (bit-identical on CPU).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch
from scipy import stats
from torch import nn

from models.checkpoint import (
    check_config,
    checkpoint_dir,
    iteration_file,
    latest_iteration_file,
    prune_iterations,
    publish_trained,
    read_payload,
    resume_message,
    save_atomic,
)
from models.learned import ResultsConfig
from models.training import SINGLE_MACHINE_SOURCES, init_parameters, training_sources
from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.metrics import episode_metrics, episode_trace
from sim.observation import ObservationConfig, encode, n_features
from sim.policies import (
    POLICIES,
    KubeDefault,
    Policy,
    choose,
    decide,
    fits_by_requests,
    is_learned,
    kube_scores,
    own_jobs,
    placed_requests,
    queue_head,
)

CHECKPOINT_FORMAT = 1
"""Version of the checkpoint layout written by `save_checkpoint`."""

SHAPE_FIELDS = ("n_machines", "capacity_units", "history_steps", "queue_size", "n_labels")
"""SimConfig fields that fix the network's input and output sizes: a checkpoint only runs under the same ones."""


STATE_MODES = ("paper", "encode")
"""`DejavuConfig.state`: Dejavu's own state (Eq. 5) or the simulator's observation plus node requests."""


@dataclass(frozen=True)
class DejavuConfig:
    """Dejavu's agent and trainer. Paper values (003) where it gives them, else DQfD's (Hester et al. 2018, the
    paper's [17]); `DEJAVU_PRESETS` names smaller runs."""

    hidden_units: tuple[int, ...] = (256, 256)
    """Widths of the fully connected hidden layers (III-C: "fully connected layers"; sizes not given)."""
    state: str = "paper"
    """What the agent sees. "paper" (default): Dejavu's state (Eq. 1-5), each node's available share of each
    resource by requests, 1 - min(requested / C_d, 1) (M x D, Eq. 3), then the pending pod's request / C_d (D,
    Eq. 4; zeros when no job waits). "encode": `sim.observation.encode` (observed-usage history, labels, the
    queue) plus, with `is_node_requests_shown`, each node's requested share. Measured (DeepPlace 50 %, the slow
    check's budget): with "encode" the pretrained agent held on 92 % of the demonstrator's holds but, on its own
    trajectory, placed on a node the head does not fit by requests in 43 % of decisions and held where one fitted
    in 37 % (it keyed on features that only correlate with kube's holds, such as the queue's length); with
    "paper" it sees exactly what kube_default decides on."""
    queue_request: str = "peak"
    """`ObservationConfig.queue_request` of the agent's features under state "encode" ("paper" shows the head's
    request as kube_default reads it). "peak" (default): the queued jobs' requests as
    the simulator's tables state them (the job's peak usage unless the trace gives one), the very requests
    kube_default filters and scores on; the paper's state includes the pending pod's quota (Eq. 4), and without
    it the agent cannot tell whether the head fits a node by requests (PWD). "trace": only a request the trace
    itself states (none for the synthetic workloads; an ablation)."""
    is_node_requests_shown: bool = True
    """Append each node's requested share (requests of its running jobs / C_d) to the features: the paper's node
    state (Eq. 3, available resources by quota). `encode` shows observed usage only, from which the requests
    kube_default filters on cannot be told (without them, in a short run, the pretrained agent matched kube_default on 47 % of
    demonstrations and held where a node fitted)."""
    discount: float = 0.99
    """gamma_d of the TD targets (not in the paper; DQfD: 0.99)."""
    n_step: int = 10
    """n of the n-step return (Eq. 10; paper: n = 10)."""
    margin: float = 0.8
    """l(a_E, a) of the large-margin loss for a != a_E (Eq. 9; DQfD: 0.8)."""
    lambda_n_step: float = 1.0
    """lambda_1, weight of J_n (Eq. 11; DQfD: 1)."""
    lambda_supervised: float = 1.0
    """lambda_2, weight of J_E (Eq. 11; DQfD: 1)."""
    lambda_l2: float = 1e-5
    """lambda_3, weight of J_L2 (Eq. 11; DQfD: 1e-5)."""
    huber_delta: float = 1.0
    """Huber threshold of the TD losses (rewards are O(1))."""
    demonstrator_prior: float = 5.0
    """Scale of a fixed Q prior that ranks the actions as the demonstrator does (`KubePrior`; not in the paper,
    0 = the paper's plain Q network): Q(s, a) = f(s, a) + scale * p(s, a), p = 0 at kube_default's choice,
    (score_a - best score) / 200 on the other nodes the head fits by requests, -1 on a node it does not fit and
    on a hold while some node fits. The network f's output layer starts at zero, so the untrained agent is its
    demonstrator, and training moves it away where the DQfD loss (TD on the competitive reward, margin) says so.
    Only under state "paper" (whose features are exactly what kube_default decides on); ignored under "encode".
    Measured on the sample profile's sequences (sample preset, 9 (source, load) cells, training seeds 0-2, 5 test
    sequences): with 0 the agent agreed with kube_default on 2-65 % of its own decisions and its return was below
    kube_default's in 8 of 9 cells (its cost 1.07x to 3.96x kube_default's); with 1, below in 1 (bitbrains 50 %,
    -13 %); with 5, none below (mean differences -0.3 % to +4.8 %, the one negative within its 95 % interval),
    while still departing from kube_default in 9-54 % of decisions. 5 makes the actions kube filters out (a node
    the head does not fit, a hold while one fits: -5) cost more than competitive rewards repay, and puts a
    10-point kube score difference at 0.25, the scale of the RBD rewards."""
    similarity_threshold: float = 0.05
    """Selective demonstrations: drop a candidate whose cosine similarity to a kept one is >= 1 - threshold
    (paper: 5 %); 0 drops only exact duplicates (in direction), 1 keeps one per action."""
    is_action_aware_selection: bool = True
    """Algorithm 3 lines 10-11: a near-duplicate state is still kept when its action differs from the kept one's."""
    n_demo_decisions: int = 1_000_000
    """Demonstrator decisions to collect before selection (paper: 10^6 demonstration instances)."""
    n_pretrain_iterations: int = 3750
    """Pretraining iterations (x updates_per_iteration = 750k updates, DQfD's pretraining length)."""
    n_rl_iterations: int = 3750
    """RL iterations (x episodes_per_iteration episodes; about the paper's 3 million timesteps at ~100 decisions
    per episode and 8 episodes per iteration)."""
    updates_per_iteration: int = 200
    """Gradient steps per iteration."""
    episodes_per_iteration: int = 8
    """Training sequences rolled in lock-step per RL iteration (and per demonstration batch)."""
    batch_size: int = 32
    """Minibatch size (DQfD: 32)."""
    learning_rate: float = 1e-4
    """Adam learning rate (DQfD: 0.0001)."""
    target_update_every: int = 10_000
    """K: gradient steps between copies of the online network into the target network (DQfD: 10000)."""
    replay_capacity: int = 1_000_000
    """N: agent decisions kept in the replay (DQfD: 1M); the demonstrations are kept besides, never overwritten."""
    epsilon_start: float = 0.1
    """Exploration at the first RL iteration (III-D-3: "gradually relying more on" exploitation)."""
    epsilon_end: float = 0.01
    """Exploration from `epsilon_decay_iterations` on (DQfD: 0.01)."""
    epsilon_decay_iterations: int = 1000
    """RL iterations over which epsilon falls linearly from start to end."""
    reward_alpha: float = 1.0
    """alpha: weight of the RBD1 difference (Algorithm 1 line 21; Algorithm 2 sums the factors: 1)."""
    reward_beta: float = 1.0
    """beta: weight of the RBD2 difference."""
    reward_gamma: float = 1.0
    """gamma: weight of PWD."""
    checkpoint_every: int = 100
    """Iterations between checkpoints (one is also written at the end)."""
    seed: int = 0
    """Seed of the network initialisation, demonstrations, exploration, minibatches and episode draws."""

    def __post_init__(self) -> None:
        positive = (
            "n_step",
            "updates_per_iteration",
            "episodes_per_iteration",
            "batch_size",
            "target_update_every",
            "replay_capacity",
            "checkpoint_every",
            "n_demo_decisions",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"DejavuConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_pretrain_iterations < 0 or self.n_rl_iterations < 0:
            raise ValueError("DejavuConfig: n_pretrain_iterations and n_rl_iterations must be >= 0")
        if not 0.0 <= self.similarity_threshold <= 1.0:
            raise ValueError(
                f"DejavuConfig.similarity_threshold must be in [0, 1], got {self.similarity_threshold}"
            )
        if not 0.0 <= self.discount <= 1.0:
            raise ValueError(f"DejavuConfig.discount must be in [0, 1], got {self.discount}")
        ObservationConfig(labels="true", queue_request=self.queue_request)
        if self.state not in STATE_MODES:
            raise ValueError(f"DejavuConfig.state must be one of {STATE_MODES}, got {self.state!r}")

    @classmethod
    def preset(cls, name: str, **overrides) -> DejavuConfig:
        """The named preset (`DEJAVU_PRESETS`) with `overrides`."""
        if name not in DEJAVU_PRESETS:
            raise ValueError(f"unknown Dejavu preset {name!r}; known: {tuple(DEJAVU_PRESETS)}")
        return cls(**(DEJAVU_PRESETS[name] | overrides))

    @classmethod
    def short(cls, **overrides) -> DejavuConfig:
        """The "short" preset (`DEJAVU_PRESETS`) with `overrides` (tests, benchmarks)."""
        return cls.preset("short", **overrides)

    @property
    def n_iterations(self) -> int:
        return self.n_pretrain_iterations + self.n_rl_iterations

    @property
    def observation(self) -> ObservationConfig:
        """What the agent sees (labels: whatever the state carries, see the module docstring)."""
        return ObservationConfig(labels="true", queue_request=self.queue_request)


DEJAVU_PRESETS: dict[str, dict] = {
    "paper": {},
    "short": {
        "hidden_units": (128, 128),
        "n_demo_decisions": 3000,
        "n_pretrain_iterations": 40,
        "n_rl_iterations": 6,
        "updates_per_iteration": 100,
        "episodes_per_iteration": 8,
        "batch_size": 64,
        "learning_rate": 1e-3,
        "target_update_every": 200,
        "replay_capacity": 50_000,
        "epsilon_decay_iterations": 3,
        "checkpoint_every": 5,
    },
    "sample": {
        "hidden_units": (64, 64),
        "n_demo_decisions": 600,
        "n_pretrain_iterations": 4,
        "n_rl_iterations": 2,
        "updates_per_iteration": 50,
        "episodes_per_iteration": 4,
        "batch_size": 64,
        "learning_rate": 1e-3,
        "target_update_every": 100,
        "replay_capacity": 50_000,
        "epsilon_decay_iterations": 1,
        "checkpoint_every": 2,
    },
}
"""DejavuConfig's presets (changes from the paper's values): "paper" (10^6 demonstrations, 750k pretraining
updates, 3750 RL iterations; for a big machine), "short" (a few minutes per source on 2 cores, still learning
visibly) and "sample" (the embedded sample's run: a partition in about a minute on a quiet 2-core machine; a
smoke run of the layer, not a trained agent worth comparing)."""

PRESET_EPISODE_JOBS = {"paper": None, "short": 150, "sample": 20}
"""Jobs per training episode of each preset: whole sequences ("paper", as evaluated), their first 150 jobs
("short"), 20 ("sample"). Long episodes let the cluster fill up by requests as it does in the evaluation's whole
sequences, where kube_default holds often; measured on DeepPlace 50 % with the short preset's budget (one seed,
6 whole test sequences, before the demonstrator prior): 60-job episodes gave a return 14 % below kube_default's, 150-job episodes 5 % (the
agent's overshoot 0.026 % vs 0.018 % of steps; kube_default 0)."""


# --- network ----------------------------------------------------------------------------------------


class KubePrior(nn.Module):
    """p(s, a) of `DejavuConfig.demonstrator_prior` from the "paper" features (`agent_features`): each node's
    available share 1 - min(requested / C_d, 1) (M x D), then the head's request / C_d (D). Back in units, the
    node's requests after placing the head, the kube-scheduler's score of each node (`sim.policies.kube_scores`,
    0..200) and its NodeResourcesFit filter; p = scale * [(score - best fitting score) / 200 on fitting nodes, -1
    on the others; hold: 0 when no node fits, else -1]. Its argmax is kube_default's action (ties to the lowest
    node where kube_default draws at random). No parameters (the state dict is the plain network's)."""

    def __init__(self, n_machines: int, capacity: Sequence[int], scale: float) -> None:
        super().__init__()
        self.n_machines = n_machines
        self.scale = scale
        self.register_buffer("capacity", torch.tensor(capacity, dtype=torch.float32), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cap = self.capacity
        m, d = self.n_machines, cap.numel()
        requested = torch.round((1.0 - x[:, : m * d].reshape(-1, m, d)) * cap)
        request = torch.round(x[:, m * d : m * d + d] * cap)
        after = requested + request[:, None, :]
        fits = (after <= cap).all(dim=2)
        frac = after / cap
        score = ((1.0 - frac) * 100.0).mean(dim=2) + (
            1.0 - frac.clamp(max=1.0).std(dim=2, unbiased=False)
        ) * 100.0
        best = torch.where(fits, score, torch.full_like(score, -torch.inf)).max(dim=1, keepdim=True).values
        nodes = torch.where(fits, (score - best) / 200.0, torch.full_like(score, -1.0))
        hold = torch.where(fits.any(dim=1, keepdim=True), -1.0, 0.0)
        return self.scale * torch.cat([nodes, hold], dim=1)


class QNetwork(nn.Module):
    """Fully connected Q network: features (N, F) -> Q values (N, M + 1), plus a fixed `prior` (N, M + 1) of the
    same features when one is given (`KubePrior`)."""

    def __init__(
        self, n_in: int, n_actions: int, hidden_units: Sequence[int], prior: nn.Module | None = None
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = n_in
        for h in hidden_units:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, n_actions))
        self.body = nn.Sequential(*layers)
        self.prior = prior

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.body(x)
        return q if self.prior is None else q + self.prior(x)


def n_agent_features(dcfg: DejavuConfig, sim_cfg: SimConfig) -> int:
    """Length of `agent_features`' vector."""
    if dcfg.state == "paper":
        return (sim_cfg.n_machines + 1) * sim_cfg.n_resources
    return n_features(sim_cfg) + (
        sim_cfg.n_machines * sim_cfg.n_resources if dcfg.is_node_requests_shown else 0
    )


def agent_features(sim_cfg: SimConfig, dcfg: DejavuConfig, state: core.State) -> np.ndarray:
    """(B, F') float32 in [0, 1]: `sim.observation.encode` with `dcfg.observation`, then, with
    `is_node_requests_shown`, each node's requested share min(requests of its running jobs / C_d, 1) (M, D) (the
    paper's node state, Eq. 3: available resources = 1 - this); zeros for done envs. With `dcfg.state` "paper":
    Dejavu's Eq. 5, each node's available share by requests 1 - min(requested / C_d, 1) (M, D), then the head's
    request / C_d (D) (zeros when no job waits)."""
    cap = np.asarray(sim_cfg.capacity_units, dtype=np.float32)
    if dcfg.state == "paper":
        available = 1.0 - np.minimum(placed_requests(state) / cap, 1.0)
        head = queue_head(state)
        pod = np.where(head.has_job[:, None], head.request / cap, 0.0)
        x = np.concatenate([available.reshape(state.batch_size, -1), pod], axis=1).astype(np.float32)
        x[state.is_done] = 0.0
        return x
    x = encode(sim_cfg, dcfg.observation, state)
    if not dcfg.is_node_requests_shown:
        return x
    nodes = np.minimum(placed_requests(state) / cap, 1.0).astype(np.float32).reshape(state.batch_size, -1)
    nodes[state.is_done] = 0.0
    return np.concatenate([x, nodes], axis=1)


def build_network(cfg: DejavuConfig, sim_cfg: SimConfig) -> QNetwork:
    """A seeded untrained Q network for `sim_cfg`'s features and actions (init drawn from cfg.seed); with the
    demonstrator prior (`DejavuConfig.demonstrator_prior`, state "paper") its output layer starts at zero."""
    prior = None
    if cfg.demonstrator_prior > 0 and cfg.state == "paper":
        prior = KubePrior(sim_cfg.n_machines, sim_cfg.capacity_units, cfg.demonstrator_prior)
    net = QNetwork(n_agent_features(cfg, sim_cfg), sim_cfg.n_actions, cfg.hidden_units, prior)
    init_parameters(net, torch.Generator().manual_seed(cfg.seed))
    if prior is not None:  # the untrained agent is its demonstrator
        nn.init.zeros_(net.body[-1].weight)
        nn.init.zeros_(net.body[-1].bias)
    return net


def masked_argmax(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N,) argmax of Q over valid actions (mask (N, A) bool; every row has a valid action, hold at least)."""
    return torch.where(mask, q, torch.full_like(q, -torch.inf)).argmax(dim=1)


def greedy_actions(net: QNetwork, features: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(B,) int64 greedy valid actions of `net` on features (B, F) with action mask (B, A)."""
    with torch.no_grad():
        q = net(torch.from_numpy(features))
    return masked_argmax(q, torch.from_numpy(mask)).numpy().astype(np.int64)


# --- competitive reward (Algorithms 1-2) ---------------------------------------------------------------


def utilisation_after(cfg: SimConfig, state: core.State, actions: np.ndarray) -> np.ndarray:
    """(B, M, D) u_m,d of the cluster right after each env's action, at the same step: requests of the jobs running
    now plus, for a placement, the head's request on the chosen node, / C_d, clipped at 1 (Eq. 3: a node's used
    share; a hold leaves the cluster as it is)."""
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    requested = placed_requests(state).astype(np.float64)
    head = queue_head(state)
    rows = np.flatnonzero((actions < cfg.n_machines) & head.has_job)
    requested[rows, actions[rows]] += head.request[rows]
    return np.minimum(requested / cap, 1.0)


def rbd1(util: np.ndarray) -> np.ndarray:
    """(B,) RBD1 = sqrt(sum_d sigma_d^2), sigma_d the population std over nodes of u_m,d (B, M, D) (Algorithm 1,
    lines 10-16)."""
    sigma = util.std(axis=1)
    return np.sqrt((sigma**2).sum(axis=1))


def rbd2(util: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """(B,) RBD2 = |u_a,cpu - u_a,mem| of the chosen node a (Algorithm 1, line 18); 0 for a hold (a = M). With
    D != 2 resources: max_d u - min_d u."""
    n_m = util.shape[1]
    node = util[np.arange(util.shape[0]), np.minimum(actions, n_m - 1)]
    spread = node.max(axis=1) - node.min(axis=1)
    return np.where(actions < n_m, spread, 0.0)


def pwd(cfg: SimConfig, state: core.State, actions: np.ndarray) -> np.ndarray:
    """(B,) PWD (Algorithm 1, line 20): -1 where the placement fails by requests (is_failed) or the action holds
    while some machine could take the head (is_idle), else 0; `state` is the state the action was taken in."""
    head = queue_head(state)
    fits = fits_by_requests(cfg, state, head.request.astype(np.int64))
    rows = np.arange(state.batch_size)
    is_place = actions < cfg.n_machines
    is_failed = is_place & ~fits[rows, np.minimum(actions, cfg.n_machines - 1)]
    placeable = fits & core.action_mask(cfg, state)[:, : cfg.n_machines]
    is_idle = ~is_place & head.has_job & placeable.any(axis=1)
    return -(is_failed | is_idle).astype(np.float64)


def competitive_reward(
    cfg: SimConfig, dcfg: DejavuConfig, state: core.State, actions: np.ndarray, base_actions: np.ndarray
) -> np.ndarray:
    """(B,) r = alpha (RBD1_base - RBD1_rl) + beta (RBD2_base - RBD2_rl) + gamma PWD_rl (module docstring), the
    agent's `actions` and the baseline's `base_actions` both taken in `state` (the copy); 0 for envs done."""
    util_rl, util_base = utilisation_after(cfg, state, actions), utilisation_after(cfg, state, base_actions)
    d1 = rbd1(util_base) - rbd1(util_rl)
    d2 = rbd2(util_base, base_actions) - rbd2(util_rl, actions)
    r = dcfg.reward_alpha * d1 + dcfg.reward_beta * d2 + dcfg.reward_gamma * pwd(cfg, state, actions)
    return np.where(state.is_done, 0.0, r)


# --- transitions ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Transitions:
    """Decisions of whole episodes, env-major (the decisions of one episode are consecutive rows), with their
    1-step and n-step targets' ingredients. Rows with is_sampled False only serve as next states."""

    features: torch.Tensor
    """(N, F) float32 encoded state before the decision."""
    mask: torch.Tensor
    """(N, A) bool valid actions in that state."""
    action: torch.Tensor
    """(N,) int64 action taken."""
    reward: torch.Tensor
    """(N,) float32 competitive reward of the decision."""
    next_index: torch.Tensor
    """(N,) int64 row of the next decision of the same episode, -1 where the episode ended."""
    return_n: torch.Tensor
    """(N,) float32 sum_{k < n'} gamma_d^k r_{t+k}, n' = min(n, decisions left)."""
    next_n_index: torch.Tensor
    """(N,) int64 row of decision t + n, -1 where the episode ends before it (no bootstrap)."""
    is_demo: torch.Tensor
    """(N,) bool: a demonstrator's decision (the large-margin loss applies)."""
    is_sampled: torch.Tensor
    """(N,) bool: the row is drawn into minibatches (selective demonstrations drop some)."""

    def __len__(self) -> int:
        return int(self.action.shape[0])

    def to_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def concat_transitions(parts: Sequence[Transitions]) -> Transitions:
    """One Transitions of `parts` in order, index columns shifted to the new rows."""
    out: dict[str, list[torch.Tensor]] = {f.name: [] for f in fields(Transitions)}
    offset = 0
    for part in parts:
        for name in out:
            value = getattr(part, name)
            if name in ("next_index", "next_n_index"):
                value = torch.where(value >= 0, value + offset, value)
            out[name].append(value)
        offset += len(part)
    return Transitions(**{name: torch.cat(values) for name, values in out.items()})


def build_transitions(
    features: np.ndarray,
    masks: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    alive: np.ndarray,
    discount: float,
    n_step: int,
    is_demo: bool,
) -> Transitions:
    """Transitions of E lock-step episodes from (K, E, ...) arrays of K decisions; alive (K, E) marks the decisions
    each env took (a prefix)."""
    n_k, n_e = alive.shape
    lengths = alive.sum(axis=0)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    envs, ks = np.nonzero(alive.T)  # env-major, decisions in order
    rew = rewards[ks, envs].astype(np.float64)
    pos = ks  # decision index within the episode
    length = lengths[envs]
    row = np.arange(envs.size)
    next_index = np.where(pos + 1 < length, row + 1, -1)
    # n-step return: sum_{k < n'} gamma^k r_{t+k}, stopping at the episode end
    ret = np.zeros(envs.size)
    for k in range(n_step):
        has = pos + k < length
        idx = np.minimum(row + k, envs.size - 1)
        ret += np.where(has, discount**k * rew[idx], 0.0)
    next_n = np.where(pos + n_step < length, row + n_step, -1)
    assert (starts[envs] + pos == row).all()
    return Transitions(
        features=torch.from_numpy(np.ascontiguousarray(features[ks, envs], dtype=np.float32)),
        mask=torch.from_numpy(masks[ks, envs].copy()),
        action=torch.from_numpy(actions[ks, envs].astype(np.int64)),
        reward=torch.from_numpy(rew.astype(np.float32)),
        next_index=torch.from_numpy(next_index.astype(np.int64)),
        return_n=torch.from_numpy(ret.astype(np.float32)),
        next_n_index=torch.from_numpy(next_n.astype(np.int64)),
        is_demo=torch.full((envs.size,), is_demo, dtype=torch.bool),
        is_sampled=torch.ones(envs.size, dtype=torch.bool),
    )


# --- episodes with the competitive reward -------------------------------------------------------------

ActFn = Callable[[core.State, np.ndarray, np.ndarray, np.random.Generator], np.ndarray]
"""(state, features (B, F), mask (B, A), rng) -> (B,) valid actions."""


@dataclass(frozen=True)
class EpisodeBatch:
    """Lock-step episodes of E envs: K decisions each at most."""

    features: np.ndarray
    """(K, E, F) float32."""
    masks: np.ndarray
    """(K, E, A) bool."""
    actions: np.ndarray
    """(K, E) int64."""
    rewards: np.ndarray
    """(K, E) float64 competitive rewards (0 where not alive)."""
    alive: np.ndarray
    """(K, E) bool."""
    final_state: core.State


def run_competitive_episodes(
    cfg: SimConfig, dcfg: DejavuConfig, jobs: JobBatch, act: ActFn, rng: np.random.Generator
) -> EpisodeBatch:
    """Roll `act` over every sequence of `jobs` (one env each, reset with seeds drawn from rng) until all are done;
    at each decision kube_default decides on the same state (the copy) and the competitive reward scores both."""
    baseline = KubeDefault()
    state = core.reset(cfg, jobs, rng.integers(0, 2**31 - 1, size=jobs.batch_size).tolist())
    feats, masks, acts, rewards, alive = [], [], [], [], []
    for _ in range(int(jobs.max_jobs + cfg.max_steps + 1)):
        is_alive = ~state.is_done
        if not is_alive.any():
            break
        x = agent_features(cfg, dcfg, state)
        mask = core.action_mask(cfg, state)
        a = np.where(is_alive, np.asarray(act(state, x, mask, rng), dtype=np.int64), cfg.n_machines)
        a_base = np.asarray(baseline.act(cfg, state, rng), dtype=np.int64)
        feats.append(x)
        masks.append(mask)
        acts.append(a)
        rewards.append(competitive_reward(cfg, dcfg, state, a, a_base))
        alive.append(is_alive)
        state, *_ = core.step(cfg, state, a, in_place=True)  # nothing above keeps a view of the old state
    if not state.is_done.all():
        raise RuntimeError("Dejavu: episodes not finished within the decision bound")
    return EpisodeBatch(
        np.stack(feats), np.stack(masks), np.stack(acts), np.stack(rewards), np.stack(alive), state
    )


def kube_act(cfg: SimConfig) -> ActFn:
    """The demonstrator: kube_default's action; where it holds (no machine fits by requests) but the simulator
    forbids holding (hold_rule="no_fit" with a machine the mask allows), the best kube score among the machines
    the mask allows instead (kube_default's filter relaxed to the simulator's rule), so demonstrations are valid."""
    policy = KubeDefault()
    cap = np.asarray(cfg.capacity_units, dtype=np.int64)

    def act(state: core.State, x: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        a = np.asarray(policy.act(cfg, state, rng), dtype=np.int64)
        is_bad = ~mask[np.arange(a.shape[0]), a]
        if is_bad.any():
            requested = placed_requests(state) + queue_head(state).request.astype(np.int64)[:, None, :]
            relaxed = choose(kube_scores(requested, cap), mask[:, : cfg.n_machines], rng)
            a = np.where(is_bad, relaxed, a)
        return a

    return act


def epsilon_greedy_act(net: QNetwork, epsilon: float) -> ActFn:
    """Greedy valid action of `net`, or with probability epsilon a uniformly random valid one."""

    def act(state: core.State, x: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        greedy = greedy_actions(net, x, mask)
        random = (rng.random(mask.shape) * mask).argmax(axis=1)
        return np.where(rng.random(mask.shape[0]) < epsilon, random, greedy)

    return act


# --- selective demonstrations (Algorithm 3) -------------------------------------------------------------


def select_demonstrations(
    features: np.ndarray, actions: np.ndarray, threshold: float, is_action_aware: bool = True
) -> np.ndarray:
    """(N,) bool: which candidates (in order) are kept. A candidate is dropped when some kept one has cosine
    similarity >= 1 - threshold with it (and, if is_action_aware, the same action); else it is kept."""
    x = np.asarray(features, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1)
    unit = np.divide(x, norms[:, None], out=np.zeros_like(x), where=norms[:, None] > 0)
    keep = np.zeros(x.shape[0], dtype=bool)
    kept_unit = np.zeros_like(unit)
    kept_action = np.zeros(x.shape[0], dtype=np.int64)
    n_kept = 0
    for i in range(x.shape[0]):
        close = kept_unit[:n_kept] @ unit[i] >= 1.0 - threshold
        if is_action_aware:
            close &= kept_action[:n_kept] == actions[i]
        if close.any():
            continue
        keep[i] = True
        kept_unit[n_kept], kept_action[n_kept] = unit[i], actions[i]
        n_kept += 1
    return keep


def collect_demonstrations(
    cfg: SimConfig, dcfg: DejavuConfig, jobs: JobBatch, rng: np.random.Generator
) -> tuple[Transitions, dict[str, int]]:
    """kube_default's lock-step episodes on batches of `episodes_per_iteration` sequences drawn from `jobs` until
    `n_demo_decisions` decisions; selective sampling (Algorithm 3). Returns the transitions and counts
    {n_candidates, n_kept}."""
    parts: list[Transitions] = []
    n_seen = 0
    while n_seen < dcfg.n_demo_decisions:
        rows = rng.choice(jobs.batch_size, size=dcfg.episodes_per_iteration, replace=True)
        ep = run_competitive_episodes(cfg, dcfg, jobs.select(rows), kube_act(cfg), rng)
        part = build_transitions(
            ep.features, ep.masks, ep.actions, ep.rewards, ep.alive, dcfg.discount, dcfg.n_step, True
        )
        parts.append(part)
        n_seen += len(part)
    demos = concat_transitions(parts)
    keep = select_demonstrations(
        demos.features.numpy(),
        demos.action.numpy(),
        dcfg.similarity_threshold,
        dcfg.is_action_aware_selection,
    )
    demos = replace(demos, is_sampled=torch.from_numpy(keep))
    return demos, {"n_candidates": len(demos), "n_kept": int(keep.sum())}


# --- DQfD loss ------------------------------------------------------------------------------------------


def _bootstrap(online: QNetwork, target: QNetwork, data: Transitions, index: torch.Tensor) -> torch.Tensor:
    """Q'(s, argmax_{a valid} Q(s, a)) at rows `index` (double Q-learning), 0 where index is -1."""
    has = index >= 0
    rows = torch.where(has, index, torch.zeros_like(index))
    x, m = data.features[rows], data.mask[rows]
    with torch.no_grad():
        best = masked_argmax(online(x), m)
        value = target(x).gather(1, best[:, None])[:, 0]
    return torch.where(has, value, torch.zeros_like(value))


def dqfd_loss(
    online: QNetwork, target: QNetwork, data: Transitions, rows: torch.Tensor, dcfg: DejavuConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """J(Q) of Eq. 11 on minibatch `rows` of `data`; returns (loss, its parts as floats)."""
    q = online(data.features[rows])
    a = data.action[rows]
    q_a = q.gather(1, a[:, None])[:, 0]
    gamma = dcfg.discount
    target_1 = data.reward[rows] + gamma * _bootstrap(online, target, data, data.next_index[rows])
    target_n = data.return_n[rows] + gamma**dcfg.n_step * _bootstrap(
        online, target, data, data.next_n_index[rows]
    )
    j_dq = nn.functional.huber_loss(q_a, target_1, delta=dcfg.huber_delta)
    j_n = nn.functional.huber_loss(q_a, target_n, delta=dcfg.huber_delta)
    is_demo = data.is_demo[rows]
    margins = torch.full_like(q, dcfg.margin)
    margins.scatter_(1, a[:, None], 0.0)
    masked = torch.where(data.mask[rows], q + margins, torch.full_like(q, -torch.inf))
    j_e_rows = masked.max(dim=1).values - q_a
    n_demo = is_demo.sum()
    j_e = (j_e_rows * is_demo).sum() / n_demo.clamp(min=1)
    j_l2 = sum((p**2).sum() for p in online.parameters())
    loss = j_dq + dcfg.lambda_n_step * j_n + dcfg.lambda_supervised * j_e + dcfg.lambda_l2 * j_l2
    parts = {
        "loss_dq": float(j_dq.detach()),
        "loss_n_step": float(j_n.detach()),
        "loss_supervised": float(j_e.detach()),
        "loss_l2": float(j_l2.detach()),
    }
    return loss, parts


# --- trainer --------------------------------------------------------------------------------------------


@dataclass
class Trainer:
    """Mutable training state (everything a checkpoint holds). Built by `new_trainer` or `load_checkpoint`."""

    cfg: DejavuConfig
    sim_cfg: SimConfig
    online: QNetwork
    target: QNetwork
    optimizer: torch.optim.Optimizer
    rng: np.random.Generator
    iteration: int = 0
    n_updates: int = 0
    replay: list[Transitions] = field(default_factory=list)
    curve: list[dict[str, float]] = field(default_factory=list)


def new_trainer(dcfg: DejavuConfig, sim_cfg: SimConfig) -> Trainer:
    """Iteration 0: seeded networks (the target a copy of the online one), Adam, the trainer's generator."""
    online = build_network(dcfg, sim_cfg)
    target = build_network(dcfg, sim_cfg)
    target.load_state_dict(online.state_dict())
    optimizer = torch.optim.Adam(online.parameters(), lr=dcfg.learning_rate)
    rng = np.random.default_rng([dcfg.seed, 2])
    return Trainer(dcfg, sim_cfg, online, target, optimizer, rng)


def _epsilon(dcfg: DejavuConfig, rl_iteration: int) -> float:
    frac = min(rl_iteration / max(dcfg.epsilon_decay_iterations, 1), 1.0)
    return dcfg.epsilon_start + frac * (dcfg.epsilon_end - dcfg.epsilon_start)


def _update(tr: Trainer, data: Transitions, candidates: np.ndarray) -> dict[str, float]:
    """`updates_per_iteration` gradient steps on minibatches drawn uniformly from `candidates` rows of data."""
    dcfg = tr.cfg
    sums: dict[str, float] = {}
    for _ in range(dcfg.updates_per_iteration):
        rows = torch.from_numpy(tr.rng.choice(candidates, size=dcfg.batch_size, replace=True))
        loss, parts = dqfd_loss(tr.online, tr.target, data, rows, dcfg)
        if not math.isfinite(float(loss.detach())):
            raise FloatingPointError(
                f"Dejavu training: non-finite loss {float(loss.detach())} at iteration {tr.iteration} "
                f"(update {tr.n_updates}; parts {parts})"
            )
        tr.optimizer.zero_grad()
        loss.backward()
        tr.optimizer.step()
        tr.n_updates += 1
        if tr.n_updates % dcfg.target_update_every == 0:
            tr.target.load_state_dict(tr.online.state_dict())
        parts["loss"] = float(loss.detach())
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + v / dcfg.updates_per_iteration
    return sums


def _trim_replay(tr: Trainer) -> None:
    while len(tr.replay) > 1 and sum(len(p) for p in tr.replay) > tr.cfg.replay_capacity:
        tr.replay.pop(0)


def train(
    dcfg: DejavuConfig,
    sim_cfg: SimConfig,
    jobs: JobBatch,
    checkpoint_dir: str | Path | None = None,
    max_iterations: int | None = None,
    log: Callable[[str], None] | None = print,
    torch_threads: int | None = 1,
) -> Trainer:
    """Train Dejavu on the training sequences `jobs` (DQfD pretraining, then RL with the competitive reward).

    With `checkpoint_dir`, resumes from its latest checkpoint (an error if it was written under another config)
    and writes one every `checkpoint_every` iterations and at the end. `max_iterations` stops after that many
    iterations in this call (a deliberate interruption, for tests). Raises FloatingPointError naming the iteration
    on a non-finite loss. `torch_threads` sets torch's intra-op threads for the call (restored after; None leaves
    them): the network is small, and on a shared 2-core machine 2 spinning threads ran the updates 20x slower than
    one (50 updates: 12 s vs 0.6 s). A resumed run must use the same value to be bit-identical."""
    previous_threads = torch.get_num_threads()
    if torch_threads is not None:
        torch.set_num_threads(torch_threads)
    try:
        return _train(dcfg, sim_cfg, jobs, checkpoint_dir, max_iterations, log)
    finally:
        torch.set_num_threads(previous_threads)


def _train(
    dcfg: DejavuConfig,
    sim_cfg: SimConfig,
    jobs: JobBatch,
    checkpoint_dir: str | Path | None,
    max_iterations: int | None,
    log: Callable[[str], None] | None,
) -> Trainer:
    if jobs.batch_size == 0 or int(jobs.n_jobs.sum()) == 0:
        raise ValueError("Dejavu training: the training sequences hold no jobs")
    ckpt_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
    latest = latest_checkpoint(ckpt_dir) if ckpt_dir is not None else None
    tr = load_checkpoint(latest, dcfg, sim_cfg) if latest is not None else new_trainer(dcfg, sim_cfg)
    if latest is not None and log:
        log(f"{resume_message(DejavuPolicy.name, tr.iteration, dcfg.n_iterations)} ({latest})")
    # demonstrations: a generator of their own, so a resumed run recomputes exactly the same ones
    demos, counts = collect_demonstrations(sim_cfg, dcfg, jobs, np.random.default_rng([dcfg.seed, 1]))
    if counts["n_kept"] == 0:
        raise ValueError("Dejavu training: no demonstration was kept")
    if log:
        log(
            f"dejavu: {counts['n_kept']} of {counts['n_candidates']} demonstrations kept (selective, Algorithm 3)"
        )
    n_done = 0
    while tr.iteration < dcfg.n_iterations and (max_iterations is None or n_done < max_iterations):
        start = time.perf_counter()
        row: dict[str, float] = {"iteration": float(tr.iteration)}
        if tr.iteration < dcfg.n_pretrain_iterations:
            row["is_pretraining"] = 1.0
            row.update(_update(tr, demos, np.flatnonzero(demos.is_sampled.numpy())))
        else:
            rl_iteration = tr.iteration - dcfg.n_pretrain_iterations
            eps = _epsilon(dcfg, rl_iteration)
            rows = tr.rng.choice(jobs.batch_size, size=dcfg.episodes_per_iteration, replace=True)
            ep = run_competitive_episodes(
                sim_cfg, dcfg, jobs.select(rows), epsilon_greedy_act(tr.online, eps), tr.rng
            )
            tr.replay.append(
                build_transitions(
                    ep.features, ep.masks, ep.actions, ep.rewards, ep.alive, dcfg.discount, dcfg.n_step, False
                )
            )
            _trim_replay(tr)
            data = concat_transitions([demos, *tr.replay])
            row.update(
                is_pretraining=0.0,
                epsilon=eps,
                mean_competitive_return=float(ep.rewards.sum(axis=0).mean()),
                std_competitive_return=float(ep.rewards.sum(axis=0).std()),
                mean_sim_return=float(ep.final_state.penalty_totals.sum(axis=1).mean()),
                **{
                    f"cost_{name}": float(-ep.final_state.penalty_totals[:, i].mean())
                    for i, name in enumerate(core.PENALTY_NAMES)
                },
            )
            row.update(_update(tr, data, np.flatnonzero(data.is_sampled.numpy())))
        tr.iteration += 1
        n_done += 1
        row["wall_s"] = time.perf_counter() - start
        tr.curve.append(row)
        if log:
            left = (dcfg.n_iterations - tr.iteration) * row["wall_s"]
            log(
                f"dejavu: iteration {tr.iteration}/{dcfg.n_iterations} loss {row['loss']:.4f} "
                + (
                    f"return {row['mean_competitive_return']:.3f} "
                    if "mean_competitive_return" in row
                    else ""
                )
                + f"{row['wall_s']:.2f} s/iter, ~{left:.0f} s left"
            )
        if ckpt_dir is not None and (
            tr.iteration % dcfg.checkpoint_every == 0 or tr.iteration == dcfg.n_iterations
        ):
            save_checkpoint(tr, iteration_file(ckpt_dir, "dejavu", tr.iteration))
    return tr


# --- checkpoints -----------------------------------------------------------------------------------------


def _config_dict(cfg) -> dict:
    return {k: _plain(v) for k, v in asdict(cfg).items()}


def _plain(value):
    """A config value as a checkpoint stores it (tuples as lists)."""
    return list(value) if isinstance(value, tuple) else value


def save_checkpoint(tr: Trainer, path: str | Path) -> Path:
    """torch.save of the state dicts, optimiser, generator, replay, curve, both configs and the iteration (written
    to a temporary file, then renamed, so a killed run never leaves half a checkpoint under the final name)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "dejavu_config": _config_dict(tr.cfg),
        "sim_config": _config_dict(tr.sim_cfg),
        "iteration": tr.iteration,
        "n_updates": tr.n_updates,
        "online": tr.online.state_dict(),
        "target": tr.target.state_dict(),
        "optimizer": tr.optimizer.state_dict(),
        "rng": tr.rng.bit_generator.state,
        "replay": [part.to_dict() for part in tr.replay],
        "curve": tr.curve,
    }
    return save_atomic(path, payload)


def latest_checkpoint(folder: Path) -> Path | None:
    """The checkpoint of the highest iteration in `folder`, or None."""
    return latest_iteration_file(folder, "dejavu")


def read_checkpoint(path: str | Path) -> dict:
    """The raw payload (torch.load with weights_only=True); ValueError naming the file when it is missing,
    corrupt, truncated or not a Dejavu checkpoint."""
    path = Path(path)
    payload = read_payload(path, "Dejavu checkpoint")
    if payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path} is not a Dejavu checkpoint (format {CHECKPOINT_FORMAT})")
    return payload


def config_of(payload: dict) -> DejavuConfig:
    """The DejavuConfig a checkpoint or trained policy was written under."""
    saved = {k: tuple(v) if isinstance(v, list) else v for k, v in payload["dejavu_config"].items()}
    return DejavuConfig(**({"demonstrator_prior": 0.0} | saved))  # written before the prior: none


def policy_payload(checkpoint_dir: Path) -> dict:
    """The trained-policy payload (`models.checkpoint.publish_policy`) of the latest checkpoint in
    `checkpoint_dir`: configs, weights, curve, the iteration it reached and the n_iterations its config asks for,
    without the replay (a paper-sized run's is gigabytes) or the optimiser. FileNotFoundError naming the folder
    when it holds no checkpoint."""
    latest = latest_checkpoint(Path(checkpoint_dir))
    if latest is None:
        raise FileNotFoundError(f"no Dejavu checkpoint in {checkpoint_dir}")
    payload = read_checkpoint(latest)
    dcfg = config_of(payload)
    drop = ("replay", "optimizer", "rng")
    return {k: v for k, v in payload.items() if k not in drop} | {
        "policy": DejavuPolicy.name,
        "config": {"dejavu": payload["dejavu_config"], "sim": payload["sim_config"]},
        "n_iterations": dcfg.n_iterations,
    }


def load_checkpoint(path: str | Path, dcfg: DejavuConfig, sim_cfg: SimConfig) -> Trainer:
    """A Trainer restored from `path`; ValueError naming the file when it was written under another Dejavu or
    simulator configuration (listing the differing fields), or is corrupt."""
    payload = read_checkpoint(path)
    saved = {"dejavu": payload["dejavu_config"], "sim": payload["sim_config"]}
    check_config(
        path, saved, {"dejavu": _config_dict(dcfg), "sim": _config_dict(sim_cfg)}, "Dejavu checkpoint"
    )
    tr = new_trainer(dcfg, sim_cfg)
    try:
        tr.online.load_state_dict(payload["online"])
        tr.target.load_state_dict(payload["target"])
        tr.optimizer.load_state_dict(payload["optimizer"])
        tr.rng.bit_generator.state = payload["rng"]
        tr.replay = [Transitions(**part) for part in payload["replay"]]
    except (KeyError, RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"Dejavu checkpoint {path} is damaged: {err}") from err
    tr.iteration = int(payload["iteration"])
    tr.n_updates = int(payload["n_updates"])
    tr.curve = list(payload["curve"])
    return tr


# --- the policy ------------------------------------------------------------------------------------------


class DejavuPolicy:
    """Greedy on masked Q of a trained Dejavu network (`checkpoint`: a trained policy file of `policy_payload`, or a
    training checkpoint), or with checkpoint=None of the seeded untrained network (DejavuConfig().seed) built on
    the first `act` from the SimConfig it is given."""

    name = "dejavu"

    def __init__(self, checkpoint: str | Path | None = None, config: DejavuConfig | None = None) -> None:
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.config = config or DejavuConfig()
        self._net: QNetwork | None = None
        self._shape: dict | None = None
        if self.checkpoint is not None:
            payload = read_checkpoint(self.checkpoint)
            self.config = config_of(payload)
            self._shape = {k: payload["sim_config"][k] for k in SHAPE_FIELDS}
            self._state_dict = payload["online"]

    def _network(self, cfg: SimConfig) -> QNetwork:
        shape = {k: _plain(getattr(cfg, k)) for k in SHAPE_FIELDS}  # as _config_dict stores them
        if self._shape is not None and shape != self._shape:
            raise ValueError(
                f"Dejavu checkpoint {self.checkpoint} was trained for {self._shape}, the simulator has {shape}"
            )
        if self._net is None:
            self._net = build_network(self.config, cfg)
            if self.checkpoint is not None:
                self._net.load_state_dict(self._state_dict)
            self._net.eval()
            self._shape = shape
        return self._net

    def act(self, cfg: SimConfig, state: core.State, rng: np.random.Generator) -> np.ndarray:
        net = self._network(cfg)
        x = agent_features(cfg, self.config, state)
        return greedy_actions(net, x, core.action_mask(cfg, state))


# --- Dejavu's own metrics (section IV-D) ------------------------------------------------------------------


def dejavu_episode_metrics(
    policy: Policy, cfg: SimConfig, jobs: JobBatch, seed: int
) -> list[dict[str, float]]:
    """Per episode: Dejavu's metrics plus `sim.metrics.episode_metrics`. Dejavu's (IV-D):
    - dejavu_util_frac: mean over steps 0..last placement step and resources of sum_m min(R, C_d) / (M C_d)
      (the cluster's resource utilisation rate "until the final pod is scheduled");
    - rbd1 / rbd2: mean over the episode's placements of RBD1 of the state after it and RBD2 of its node;
    - completion_time_steps: the step at which the last job finished (or the truncation step);
    - turnaround_time_steps: mean over placed jobs of finish - arrival (finish = start + duration)."""
    rng = np.random.default_rng(seed)
    state = own_jobs(core.reset(cfg, jobs, seed))  # job pickers reorder it in place
    trace = core.make_trace(cfg, jobs.batch_size)
    n_env = jobs.batch_size
    rbd1_sum, rbd2_sum, n_placed = np.zeros(n_env), np.zeros(n_env), np.zeros(n_env)
    last_place = np.zeros(n_env, dtype=np.int64)
    for _ in range(int(jobs.max_jobs + cfg.max_steps + 1)):
        if state.is_done.all():
            break
        was_alive = ~state.is_done
        state_for, actions = decide(policy, cfg, state, rng, in_place=True)
        t_now = state_for.t.copy()
        util = utilisation_after(cfg, state_for, actions)
        state, *_ = core.step(cfg, state_for, actions, trace, in_place=True)  # state_for is not read again
        is_place = was_alive & (actions < cfg.n_machines)
        rbd1_sum += np.where(is_place, rbd1(util), 0.0)
        rbd2_sum += np.where(is_place, rbd2(util, actions), 0.0)
        n_placed += is_place
        last_place = np.where(is_place, t_now, last_place)
    if not state.is_done.all():
        raise RuntimeError(f"policy {policy.name!r}: episodes not finished")
    out = []
    cap = np.asarray(cfg.capacity_units, dtype=np.float64)
    for b in range(n_env):
        ep = episode_trace(trace, state, b)
        metrics = episode_metrics(ep)
        served = np.minimum(ep.usage[: last_place[b] + 1], cap)  # (T', M, D)
        util = float((served.sum(axis=1) / (cfg.n_machines * cap)).mean()) if served.size else 0.0
        n_jobs = int(state.jobs.n_jobs[b])
        start = state.job_start[b, :n_jobs]
        placed = start >= 0
        finish = start + state.jobs.duration[b, :n_jobs]
        turnaround = finish[placed] - state.jobs.arrival_step[b, :n_jobs][placed]
        metrics.update(
            dejavu_util_frac=util,
            rbd1=float(rbd1_sum[b] / max(n_placed[b], 1)),
            rbd2=float(rbd2_sum[b] / max(n_placed[b], 1)),
            completion_time_steps=float(state.t[b]),
            turnaround_time_steps=float(turnaround.mean()) if turnaround.size else float("nan"),
        )
        out.append(metrics)
    return out


def compare_policies(
    policies: dict[str, Policy], cfg: SimConfig, jobs: JobBatch, seed: int = 0
) -> pl.DataFrame:
    """One row per (policy, sequence) with `dejavu_episode_metrics`; pass kube_default among the policies for
    Dejavu's baseline."""
    rows = []
    for name, policy in policies.items():
        for i, m in enumerate(dejavu_episode_metrics(policy, cfg, jobs, seed)):
            rows.append({"policy": name, "sequence": i, **m})
    return pl.DataFrame(rows)


DEJAVU_METRICS = ("dejavu_util_frac", "rbd1", "rbd2", "completion_time_steps", "turnaround_time_steps")
"""Dejavu's own metrics (section IV-D), the columns `dejavu_episode_metrics` adds; which way is better:
utilisation higher, the rest lower."""


def evaluate_dejavu_metrics(
    jobs_frame: pl.DataFrame,
    policies: Sequence[str],
    cfg: SimConfig,
    seeds: Sequence[int],
    make: Callable[[str, str, int, int], Policy | None],
) -> tuple[pl.DataFrame, list[str]]:
    """(episodes, left out): one row per (source, load_pct, policy, sequence_id, seed) of the test split of
    `jobs_frame` (`sim__job_sequences` rows) with DEJAVU_METRICS, is_truncated and n_unplaced, every sequence of a
    (source, load_pct) run as one batch. `make(name, source, load_pct, seed)` builds each policy (a learned one
    from its training seed `seed`, which also seeds the simulator); where it returns None the run is left out and
    named in the second value."""
    test = jobs_frame.filter(pl.col("split") == "test")
    if test.height == 0:
        raise ValueError("evaluate_dejavu_metrics: no test sequences")
    rows, missing = [], []
    for (source, load), group in test.group_by("source", "load_pct", maintain_order=True):
        jobs = JobBatch.from_frame(group)
        seq_ids = [key[-1] for key in jobs.sequence_keys]
        for name in policies:
            for seed in seeds:
                policy = make(name, source, int(load), seed)
                if policy is None:
                    missing.append(f"{name} {source} {load}% seed {seed}")
                    continue
                for seq_id, m in zip(seq_ids, dejavu_episode_metrics(policy, cfg, jobs, seed), strict=True):
                    rows.append(
                        {"source": source, "load_pct": int(load), "policy": name, "sequence_id": seq_id}
                        | {"seed": seed, "is_truncated": m["is_truncated"], "n_unplaced": m["n_unplaced"]}
                        | {k: m[k] for k in DEJAVU_METRICS}
                    )
    return pl.DataFrame(rows), missing


def summarise_dejavu_metrics(episodes: pl.DataFrame, confidence: float = 0.95) -> pl.DataFrame:
    """One row per (source, load_pct, policy) of `evaluate_dejavu_metrics`' episodes: n_sequences, n_seeds,
    n_truncated (episodes), and per metric of DEJAVU_METRICS its mean over test sequences (seeds averaged within
    a sequence first, as `sim.evaluate.summarise`) and `<metric>_ci95`, the half-width of its t-interval over
    sequences (0 with one sequence). NaN values (turnaround with nothing placed) are left out of the mean."""
    keys = ["source", "load_pct", "policy"]
    per_seq = episodes.group_by(*keys, "sequence_id", maintain_order=True).agg(
        pl.len().alias("n_seeds"),
        pl.col("is_truncated").sum().alias("n_truncated"),
        *[pl.col(c).fill_nan(None).mean() for c in DEJAVU_METRICS],
    )
    out = per_seq.group_by(*keys, maintain_order=True).agg(
        pl.len().alias("n_sequences"),
        pl.col("n_seeds").max(),
        pl.col("n_truncated").sum().cast(pl.Int64),
        *[pl.col(c).mean() for c in DEJAVU_METRICS],
        *[pl.col(c).std().fill_null(0.0).alias(f"{c}_std") for c in DEJAVU_METRICS],
        *[pl.col(c).count().alias(f"{c}_n") for c in DEJAVU_METRICS],
    )
    halves = []
    for c in DEJAVU_METRICS:
        n = out[f"{c}_n"].to_numpy()
        t = np.array([stats.t.ppf(0.5 + confidence / 2, k - 1) if k > 1 else 0.0 for k in n])
        halves.append(pl.Series(f"{c}_ci95", t * out[f"{c}_std"].to_numpy() / np.sqrt(np.maximum(n, 1))))
    cols = [*keys, "n_sequences", "n_seeds", "n_truncated"]
    for c in DEJAVU_METRICS:
        cols += [c, f"{c}_ci95"]
    return out.with_columns(halves).select(cols).sort(keys)


# --- the training and metrics runs of the assets

SINGLE_NODE_SOURCES = SINGLE_MACHINE_SOURCES
"""Sources Dejavu neither trains on nor is measured on: DeepRM's workload runs on one node (its single pool),
where placement has no choice."""


@dataclass(frozen=True)
class DejavuTrainConfig:
    """Dejavu's training runs of one (load, seed): a preset of DejavuConfig (`DEJAVU_PRESETS`), a few overrides,
    the sources. Every source but DeepRM's single-pool workload (one node: placement has no choice)."""

    preset: str = "paper"
    """'paper' (10^6 demonstrations, 750k pretraining updates, 3750 RL iterations), 'short' or 'sample'"""
    n_pretrain_iterations: int = -1
    """override the preset's pretraining iterations (-1 = keep)"""
    n_rl_iterations: int = -1
    """override the preset's RL iterations (-1 = keep)"""
    n_demo_decisions: int = 0
    """override the preset's demonstrator decisions (0 = keep)"""
    sources: tuple[str, ...] = ()
    """sources to train on (empty: every source with sequences)"""

    def __post_init__(self) -> None:
        if self.preset not in DEJAVU_PRESETS:
            raise ValueError(f"rl__dejavu: unknown preset {self.preset!r}; known: {tuple(DEJAVU_PRESETS)}")

    def train_sources(self, have: Sequence[str]) -> list[str]:
        return training_sources(have, self.sources, SINGLE_NODE_SOURCES)

    def configs(self, seed: int, n_labels: int) -> tuple[DejavuConfig, SimConfig]:
        """(agent, training simulator) of a run: TVW-RL's cluster (M = 10) with the evaluation's safety cap (1000
        steps) and label count (`n_labels`: the network's input must match the evaluation's simulator,
        `eval_label_count`), episodes of PRESET_EPISODE_JOBS[preset] jobs."""
        changes: dict = {"seed": seed}
        if self.n_pretrain_iterations >= 0:
            changes["n_pretrain_iterations"] = self.n_pretrain_iterations
        if self.n_rl_iterations >= 0:
            changes["n_rl_iterations"] = self.n_rl_iterations
        if self.n_demo_decisions:
            changes["n_demo_decisions"] = self.n_demo_decisions
        sim = SimConfig(max_steps=1000, jobs_per_episode=PRESET_EPISODE_JOBS[self.preset], n_labels=n_labels)
        return DejavuConfig.preset(self.preset, **changes), sim


def eval_label_count(jobs: pl.DataFrame) -> int:
    """n_labels of the evaluation's simulator for the sequences `jobs` (every label present, at least the default)."""
    return max(SimConfig().n_labels, int(jobs["ec_label"].max() or 0) + 1)


def train_and_publish(
    dcfg: DejavuConfig,
    sim_cfg: SimConfig,
    jobs: JobBatch,
    policy_file: Path,
    run: tuple[str, int, int],
    revision: str,
    log: Callable[[str], None] | None = None,
) -> pl.DataFrame:
    """`train` resuming from the checkpoints beside `policy_file` (`models.checkpoint.checkpoint_dir`), then the
    trained policy (weights and configs, no replay) published there with its sidecar (run = (source, load %,
    training seed), both configs, git `revision`) and the older checkpoints dropped (a resumed run needs only the
    latest). Returns the learning curve with DEJAVU_CURVE's names (`dejavu_curve`)."""
    ckpt_dir = checkpoint_dir(policy_file)
    trainer = train(dcfg, sim_cfg, jobs, checkpoint_dir=ckpt_dir, log=log)
    config_json = {"dejavu": asdict(dcfg), "sim": asdict(sim_cfg)}
    publish_trained(policy_file, policy_payload(ckpt_dir), *run, config_json, revision)
    prune_iterations(ckpt_dir, "dejavu")
    return dejavu_curve(trainer.curve)


def dejavu_curve(rows: list[dict]) -> pl.DataFrame:
    """The learning-curve rows of `train` with DEJAVU_CURVE's names (`models.training.stack_curves` adds the
    columns a run did not report, as nulls)."""
    return pl.DataFrame(rows).rename(
        {"mean_competitive_return": "mean_return", "std_competitive_return": "std_return"}, strict=False
    )


DEJAVU_CURVE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "seed": pl.Int64,  # training seed
    "iteration": pl.Int64,
    "is_pretraining": pl.Boolean,  # DQfD pretraining on demonstrations only (no episode, returns null)
    "mean_return": pl.Float64,  # mean competitive return (Algorithm 2) of the iteration's episodes (RL phase)
    "std_return": pl.Float64,
    "mean_sim_return": pl.Float64,  # mean simulator return of those episodes (TVW-RL's penalties)
    "cost_contention": pl.Float64,  # the simulator's penalties of those episodes as positive costs
    "cost_underutil": pl.Float64,
    "cost_overshoot": pl.Float64,
    "cost_wait": pl.Float64,
    "cost_unplaced": pl.Float64,
    "epsilon": pl.Float64,  # exploration of the RL iteration
    "loss": pl.Float64,  # DQfD loss (Eq. 11), mean over the iteration's updates
    "loss_dq": pl.Float64,
    "loss_n_step": pl.Float64,
    "loss_supervised": pl.Float64,
    "loss_l2": pl.Float64,
    "wall_s": pl.Float64,  # seconds the iteration took
}
"""Columns of `rl__dejavu`: one row per (source, load, training seed, iteration)."""

DEJAVU_METRICS_TABLE = {
    "source": pl.String,
    "load_pct": pl.Int32,
    "policy": pl.String,
    "n_sequences": pl.Int64,  # test sequences the means are over (seeds averaged within a sequence first)
    "n_seeds": pl.Int64,
    "n_truncated": pl.Int64,  # episodes that hit the safety cap
    **{c: pl.Float64 for m in DEJAVU_METRICS for c in (m, f"{m}_ci95")},
}
"""Columns of `eval__dejavu_metrics`: one row per (source, load, policy)."""

DEJAVU_COMPETITORS = ("dejavu", "kube_default", "best_fit", "tetris")
"""Dejavu and the heuristics it is measured against: kube_default (its demonstrator and competitive baseline),
Best-Fit and Tetris."""

METRICS_LEARNED = ("dejavu", "deeprm_rl")
"""The learned policies whose Dejavu metrics are measured (DejavuPolicy, DeepRMAgentPolicy)."""


@dataclass(frozen=True)
class DejavuMetricsConfig(ResultsConfig):
    """`eval__results`' simulator and seeds; the policies are Dejavu and its competitors."""

    policies: tuple[str, ...] = DEJAVU_COMPETITORS
    """policies to measure: registered heuristics, and the learned dejavu / deeprm_rl"""

    def __post_init__(self) -> None:
        unsupported = [
            p for p in self.policies if p in POLICIES and is_learned(p) and p not in METRICS_LEARNED
        ]
        if unsupported:
            raise ValueError(
                f"eval__dejavu_metrics: learned policies {unsupported} are not measured here "
                f"(learned ones it loads: {list(METRICS_LEARNED)})"
            )


def truncation_check(table: pl.DataFrame) -> tuple[bool, dict]:
    """(passed, metadata) of "no episode hits the safety cap" on a DEJAVU_METRICS_TABLE: the truncated episodes
    and the (source, load_pct, policy) groups they are in."""
    cut = table.filter(pl.col("n_truncated") > 0)
    groups = cut.select("source", "load_pct", "policy").to_dicts()
    return cut.height == 0, {"n_truncated_episodes": int(cut["n_truncated"].sum()), "groups": groups}
