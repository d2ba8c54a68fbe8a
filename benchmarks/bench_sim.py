"""Throughput of the batched simulator core: env-steps per second of step(), and observe() calls per second.

An env-step is one env's step; a batched call with B envs counts B. Jobs are synthetic (random square-ish
profiles), the policy picks uniformly among valid actions with a bias towards placing; episodes that end are reset
for the whole batch when every env is done. Prints B = 1 and B = 256 for M = 10 and M = 50 and the batched/single
ratio, all measured in this one run; each with the numpy step and with the compiled in-place step
(`core.step(..., in_place=True)`, `sim.compiled_step`) and their ratio.

Then the policy-gradient rollout (`sim.rollout`): B x N = 20 x 20 = 400 envs, M = 10, decisions per second with
the network encoding built before every decision (`sim.observation.encode`) and the action mask computed once per
decision (passed to step), printed beside the step-only rate of the same rollout and the share of time spent
encoding and masking (target: >= 100k observed decisions/s on 2 cores).

Run: .venv/bin/python benchmarks/bench_sim.py [--seconds 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sim import core
from sim.config import SimConfig
from sim.jobs import JobBatch


def make_jobs(n_envs: int, n_jobs: int, max_duration: int, rng: np.random.Generator) -> JobBatch:
    """Synthetic sequences: arrivals ~ 2 jobs per step, profiles uniform 1..3 units, durations 5..max_duration."""
    seqs = []
    for _ in range(n_envs):
        arrivals = np.sort(rng.integers(0, n_jobs // 2 + 1, size=n_jobs))
        seq = []
        for a in arrivals:
            dur = int(rng.integers(5, max_duration + 1))
            seq.append(
                dict(
                    arrival_step=int(a),
                    usage=rng.integers(1, 4, size=(dur, 2)).tolist(),
                    ec_label=int(rng.integers(8)),
                )
            )
        seqs.append(seq)
    return JobBatch.from_jobs(seqs)


def sample_actions(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform over valid placements when any (hold 10% of the time), else hold."""
    scores = rng.random(mask.shape) * mask
    scores[:, -1] = 0.1 * mask[:, -1]
    return scores.argmax(axis=1)


def bench_step(
    cfg: SimConfig, n_envs: int, seconds: float, seed: int = 0, in_place: bool = False
) -> tuple[float, float]:
    """(env-steps/s of step(), observe() calls x B per second); `in_place`: the compiled in-place step."""
    rng = np.random.default_rng(seed)
    jobs = make_jobs(n_envs, 40, 30, rng)
    state = core.reset(cfg, jobs, seed)
    n_steps, elapsed = 0, 0.0
    while elapsed < seconds:
        actions = sample_actions(core.action_mask(cfg, state), rng)
        t0 = time.perf_counter()
        state, *_ = core.step(cfg, state, actions, in_place=in_place)
        elapsed += time.perf_counter() - t0
        n_steps += n_envs
        if state.is_done.all():
            state = core.reset(cfg, jobs, int(rng.integers(1 << 30)))
    t0 = time.perf_counter()
    n_obs = 0
    while time.perf_counter() - t0 < seconds / 4:
        core.observe(cfg, state)
        n_obs += n_envs
    return n_steps / elapsed, n_obs / (time.perf_counter() - t0)


def bench_rollout(n_seq: int = 20, n_traj: int = 20, seed: int = 0) -> None:
    """Observed decisions/s of a lock-step rollout (encode + mask + random valid policy + step) vs step only."""
    from sim.observation import ObservationConfig, encode

    rng = np.random.default_rng(seed)
    cfg = SimConfig(n_machines=10, max_steps=200, hold_rule="no_fit")
    obs_cfg = ObservationConfig(labels="true")
    jobs = make_jobs(n_seq, 60, 30, rng).select(np.repeat(np.arange(n_seq), n_traj))
    timings = {"encode": 0.0, "mask": 0.0, "step": 0.0}
    n_decisions = 0
    state = core.reset(cfg, jobs, seed)
    t_all = time.perf_counter()
    while not state.is_done.all():
        n_decisions += int((~state.is_done).sum())  # envs that finished wait and are not counted
        t0 = time.perf_counter()
        encode(cfg, obs_cfg, state)
        t1 = time.perf_counter()
        mask = core.action_mask(cfg, state)
        t2 = time.perf_counter()
        state, *_ = core.step(cfg, state, sample_actions(mask, rng), mask=mask)
        t3 = time.perf_counter()
        timings["encode"] += t1 - t0
        timings["mask"] += t2 - t1
        timings["step"] += t3 - t2
    total = time.perf_counter() - t_all
    print(
        f"rollout B x N = {jobs.batch_size} (M=10): {n_decisions / total:12,.0f} observed decisions/s   "
        f"step only {n_decisions / timings['step']:12,.0f} decisions/s   "
        f"encode {100 * timings['encode'] / total:.0f} % of the time, mask {100 * timings['mask'] / total:.0f} %"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per configuration")
    args = parser.parse_args()
    for n_machines in (10, 50):
        cfg = SimConfig(n_machines=n_machines, max_steps=200)
        rates = {}
        bench_step(cfg, 2, 0.01, in_place=True)  # numba compiles (or loads its cache) here, not in the timing
        for n_envs in (1, 256):
            step_rate, obs_rate = bench_step(cfg, n_envs, args.seconds)
            compiled_rate, _ = bench_step(cfg, n_envs, args.seconds, in_place=True)
            rates[n_envs] = step_rate
            print(
                f"M={n_machines:3d} B={n_envs:4d}: step {step_rate:12,.0f} env-steps/s   observe {obs_rate:10,.0f} "
                f"env-obs/s   compiled in-place step {compiled_rate:12,.0f} env-steps/s "
                f"({compiled_rate / step_rate:.1f}x)"
            )
        print(f"M={n_machines:3d} batched/single ratio: {rates[256] / rates[1]:.1f}x")
    bench_rollout()


if __name__ == "__main__":
    main()
