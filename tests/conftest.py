"""Shared by every test: importing `models` registers the learned schedulers in `sim.policies.POLICIES` (sim names
no models module), so a test of sim/ that loops over the registry sees them as every entry point does.

Numba's kernels run on the caller's thread (one numba thread per test process), as in each of tvw-run's workers:
the two xdist workers share two cores, and a kernel's threaded variant compiles for tens of seconds on a fresh
checkout, so only the tests that ask for it (`on_threads`) compile and run it, on every core."""

import numba
import numpy as np
import polars as pl
import pytest

import models  # noqa: F401 - registers the learned policies
from sim.jobs import JobBatch

# `sim.compiled_step.on_threads` is then False unless a test's `on_threads` fixture says otherwise
numba.set_num_threads(1)


@pytest.fixture
def square_jobs():
    """A maker of job sequences for the compiled kernels' tests: (n_rows, n_jobs, seed) -> JobBatch."""
    return _square_jobs


def _square_jobs(n_rows: int, n_jobs: int, seed: int) -> JobBatch:
    """Square-wave jobs (high 3-5 units part of each period, low 1) at random phases, requests 3-6, labels 0..3."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        seq, t = [], 0
        for _ in range(n_jobs):
            t += int(rng.integers(0, 2))
            dur, period, phase = int(rng.integers(4, 30)), int(rng.integers(3, 9)), int(rng.integers(0, 8))
            hi = int(rng.integers(3, 6))
            usage = [[hi if (a + phase) % period < max(period // 3, 1) else 1, 1 + a % 2] for a in range(dur)]
            req = [max(hi, int(rng.integers(3, 7))), 2 + int(rng.integers(0, 3))]
            seq.append(
                {"arrival_step": t, "usage": usage, "ec_label": int(rng.integers(0, 4)), "request": req}
            )
        rows.append(seq)
    return JobBatch.from_jobs(rows)


@pytest.fixture
def perturb_committed():
    """A maker of the same state with the committed future of the placed jobs scrambled: (state, seed) -> state.
    Every slot of the usage ring (`State.timeline`) but step t's, and of the future-overlap ring (`State.overlap`)
    but step t's, gets random units added. A leak test that perturbs only `JobBatch.usage` leaves these as they
    were, so a scheduler input reading the timeline beyond step t would pass it unseen; compose the two."""
    return _perturb_committed


def _perturb_committed(state, seed: int):
    from dataclasses import replace

    rng = np.random.default_rng(seed)
    width = state.timeline.shape[1]
    later = np.arange(width)[None, :] != (state.t % width)[:, None]  # (B, W): every slot but step t's
    noise = rng.integers(1, 9, size=state.timeline.shape) * later[:, :, None, None]
    overlap_noise = rng.integers(1, 99, size=state.overlap.shape) * later
    return replace(
        state,
        timeline=(state.timeline + noise).astype(state.timeline.dtype),
        overlap=(state.overlap + overlap_noise).astype(state.overlap.dtype),
    )


@pytest.fixture
def on_threads(monkeypatch, request):
    """`on_threads(threads, module, *kernels)`: the compiled wrappers of `module` run their per-env bodies on the
    caller's side (threads="caller": their serial kernel, or one span of the prange kernel where `launch` runs it)
    or on numba's threads (threads="numba", whatever the batch size); returns a dict counting the calls of each
    named parallel kernel, so a test can assert that they ran. On numba's threads the
    test gets all of them back (every core), so envs really run side by side."""

    def setup(threads: str, module, *kernels: str) -> dict[str, int]:
        monkeypatch.setattr(module, "on_threads", lambda n_envs: threads == "numba")
        if threads == "numba":
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
            request.addfinalizer(lambda: numba.set_num_threads(1))
        if hasattr(module, "output_array"):  # outputs start as NaN: a skipped row fails the comparison
            monkeypatch.setattr(module, "output_array", lambda shape: np.full(shape, np.nan))
        calls = dict.fromkeys(kernels, 0)
        for name in kernels:
            kernel = getattr(module, name)

            def counted(*args, _name=name, _kernel=kernel):
                calls[_name] += 1
                return _kernel(*args)

            monkeypatch.setattr(module, name, counted)
        return calls

    return setup


@pytest.fixture
def results_frame():
    """A maker of `eval__results`-shaped rows for the gap table's tests: (rows of (policy, sequence_id, return),
    policy -> kind, optional policy -> overshoot % and policy -> machines used) -> DataFrame (source "s", 50 %)."""
    return _results_frame


def _results_frame(
    rows: list[tuple], kinds: dict[str, str], overshoot: dict | None = None, machines: dict | None = None
) -> pl.DataFrame:
    return pl.DataFrame(
        [
            {
                "source": "s",
                "load_pct": 50,
                "policy": policy,
                "sequence_id": seq,
                "seed": 0,
                "n_machines": 10,
                "policy_kind": kinds[policy],
                "is_oracle": kinds[policy] == "oracle",
                "is_learned": kinds[policy] == "learned",
                "episode_return": float(ret),
                "avg_overshoot_pct": (overshoot or {}).get(policy, 0.0),
                "machines_used": (machines or {}).get(policy, 5.0),
            }
            for policy, seq, ret in rows
        ]
    )
