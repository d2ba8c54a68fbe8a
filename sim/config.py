"""Simulator configuration: the cluster, the state image, the penalty weights and the noise knobs.

Defaults are TVW-RL's (AAAI 2021, "Implementation"): M = 10 machines, h = 20 steps of history,
d = 2 resources with C_1 = C_2 = 8 units, K_c = 0.1, K_u = 3, K_o = 30000, K_w = 50.

Episode length is counted in logical TIME STEPS (never in decisions): an episode runs until every job of its
sequence has been placed and has finished; `max_steps` is only a safety cap, and an episode that reaches it is a
failure (reported as truncated, with every job left unplaced charged, see `sim.penalties.unplaced_charge`).
TVW-RL's "maximum episode length L = 200" with "a fixed number of jobs" per episode is the training setup:
`max_steps=200` with `jobs_per_episode` set so that episodes fit.
"""

from __future__ import annotations

from dataclasses import dataclass

INVALID_ACTION_MODES = ("raise", "hold")
HOLD_RULES = ("always", "no_fit")
OVERSIZE_MODES = ("raise", "clip")
PLACEMENT_CHECKS = ("first_step", "request", "none")
MAX_PIXEL_VALUE = 127  # the machine image is int8


@dataclass(frozen=True)
class SimConfig:
    """Parameters of one simulated cluster (shared by every env of a batch)."""

    n_machines: int = 10
    """M: machines in the cluster; actions 0..M-1 place the queue head, action M holds."""
    capacity_units: tuple[int, ...] = (8, 8)
    """C_d: quantised capacity of every machine per resource (cpu, mem), in units."""
    history_steps: int = 20
    """h: past logical steps shown per machine in the state image (current step included)."""
    queue_size: int = 5
    """Visible queue slots in the observation; further waiting jobs only count in the backlog (DeepRM)."""
    n_labels: int = 16
    """G: number of EC labels (ec_label in 0..G-1); 16 covers every k of the EC sweep (3..15)."""
    max_instances: int = 4
    """Colour shades per label in the image (DeepPlace instance colouring); the k-th co-located instance of a
    label on a machine (by start) gets shade min(k, max_instances - 1)."""
    k_contention: float = 0.1
    """K_c: weight of the contention penalty P_C (per unit^2 of realised overlap)."""
    k_underutil: float = 3.0
    """K_u: exponent of the under-utilisation penalty P_U = -sum |U_m(t,d)|^K_u (U in raw units). Read
    literally, K_u = 0 would charge 1 per used machine and resource (0^0 = 1); we treat K_u = 0 as "off", which
    matches TVW-RL Table 3 (its K_u = 0 row uses the most machines)."""
    k_overshoot: float = 30000.0
    """K_o: penalty per (workload, resource) at its first overshoot."""
    k_wait: float = 50.0
    """K_w: penalty per waiting job per time step."""
    max_steps: int = 1000
    """Safety cap in logical time steps. Episodes end when every job has been placed and has finished; reaching
    the cap first truncates the episode, which counts as a failure: each job not placed by then is charged
    `sim.penalties.unplaced_charge` (more than any placement of it could cost), so leaving work undone never
    pays. TVW-RL trains with L = 200 (set max_steps=200 and `jobs_per_episode`)."""
    jobs_per_episode: int | None = None
    """TVW-RL's "a fixed number of jobs arrive" per episode: only the first n jobs (by arrival) of each sequence
    are used; None = the whole sequence."""
    hold_rule: str = "always"
    """When the hold action (M) is valid. "always": DeepRM's void action, time advances (a policy may wait for a
    better machine, paying K_w per waiting job and step). "no_fit": TVW-RL / DeepPlace, the agent must place
    the head when some machine can take it; hold is valid only when no machine can (or the queue is empty).
    Either way the episode runs until every job is placed and finished, so withholding work never pays."""
    noise_max_units: int = 0
    """Background noise: each step, each machine and resource gets uniform integer 0..n extra units
    (TVW-RL robustness study uses n in {1, 2, 3}); 0 disables it."""
    is_shape_perturbed: bool = False
    """Add uniform integer -1..1 to every step of each job's usage profile at reset (clipped to 0..C_d);
    requests are left as given, so the scheduler's estimate and the real usage differ."""
    placement_check: str = "first_step"
    """Action-mask rule: "first_step" (current free units incl. noise cover the head's first-step usage),
    "request" (current free units cover the head's request) or "none" (any machine; overshoot is penalised)."""
    invalid_action: str = "raise"
    """What step() does with a masked action: "raise" ValueError, or "hold" (treat it as the hold action)."""
    oversize: str = "raise"
    """A job whose usage or request exceeds C_d: "raise" ValueError naming it, or "clip" it to C_d and count."""
    seed: int = 0
    """Default seed of noise and shape perturbation (reset(seed=None) uses it)."""

    def __post_init__(self) -> None:
        if self.n_machines < 1:
            raise ValueError(f"n_machines must be >= 1, got {self.n_machines}")
        if len(self.capacity_units) < 1 or min(self.capacity_units) < 1:
            raise ValueError(f"capacity_units must be positive, got {self.capacity_units}")
        if self.history_steps < 1 or self.queue_size < 1 or self.max_steps < 1:
            raise ValueError("history_steps, queue_size and max_steps must be >= 1")
        if self.jobs_per_episode is not None and self.jobs_per_episode < 1:
            raise ValueError(f"jobs_per_episode must be >= 1 or None, got {self.jobs_per_episode}")
        if self.n_labels * self.max_instances + 1 > MAX_PIXEL_VALUE:
            raise ValueError(
                f"n_labels * max_instances + 1 = {self.n_labels * self.max_instances + 1} "
                f"does not fit the int8 image (max {MAX_PIXEL_VALUE})"
            )
        if not 0 <= self.noise_max_units <= min(self.capacity_units):
            raise ValueError(f"noise_max_units must be in 0..min(C_d), got {self.noise_max_units}")
        for name, value, allowed in (
            ("placement_check", self.placement_check, PLACEMENT_CHECKS),
            ("invalid_action", self.invalid_action, INVALID_ACTION_MODES),
            ("oversize", self.oversize, OVERSIZE_MODES),
            ("hold_rule", self.hold_rule, HOLD_RULES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")

    @property
    def n_resources(self) -> int:
        """D: number of resource dimensions."""
        return len(self.capacity_units)

    @property
    def n_actions(self) -> int:
        """M + 1: place on machine 0..M-1, or hold."""
        return self.n_machines + 1

    @property
    def noise_pixel(self) -> int:
        """Image value of a unit used by background noise (after every label/shade colour)."""
        return self.n_labels * self.max_instances + 1
