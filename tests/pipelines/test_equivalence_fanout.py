"""What the fanned-out EC steps recompute or rebuild equals what one sweep over every method holds."""

from dataclasses import replace

import numpy as np
import pytest

from pipelines.equivalence import (
    DtwConfig,
    EcConfig,
    ari_across_seeds,
    ari_of_labels,
    method_inputs,
    profiles_frame,
    profiles_of,
    sweep_methods,
)
from pipelines.features import TemporalConfig, series_from_arrays

FAST = EcConfig(k_min=3, k_max=5, n_init=4, temporal=TemporalConfig(lags=(1, 6, 12), agg_chunk_len=12))


def _series(n_per: int = 6, length: int = 96, seed: int = 0):
    rng = np.random.default_rng(seed)
    t = np.arange(length)
    shapes = [0.3 + 0.1 * np.sin(2 * np.pi * t / 24), 0.1 + 0.4 * t / length, 0.9 - 0.4 * t / length]
    values = np.array([s + 0.02 * rng.standard_normal((2, length)) for s in shapes for _ in range(n_per)])
    return series_from_arrays([f"w{i:02d}" for i in range(len(values))], values)


@pytest.mark.parametrize("method", ["aggregate", "temporal", "dtw"])
def test_one_method_alone_and_its_recomputed_inputs_equal_the_sweep_over_all(method):
    series = _series()
    every = sweep_methods(series, "s", FAST)
    alone = sweep_methods(series, "s", replace(FAST, methods=(method,)))
    rows = every.silhouette.filter(every.silhouette["method"] == method)
    assert alone.silhouette.equals(rows)
    assert all(np.array_equal(alone.labels[method][k], every.labels[method][k]) for k in every.labels[method])
    inputs = method_inputs(series, method, FAST)
    if method == "dtw":
        for got, want in zip(inputs, every.inputs["dtw"], strict=True):
            assert np.array_equal(got, want)
    else:
        assert np.array_equal(inputs, every.inputs[method])
    k = every.best_k[method]
    labels = every.labels[method][k]
    assert ari_of_labels(labels, inputs, method, k, FAST, 2) == ari_across_seeds(
        series, every, method, k, FAST, 2
    )
    medoids = every.medoids.get(method, {}).get(k)
    assert profiles_of("s", series, method, k, labels, medoids).equals(
        profiles_frame(every, series, method, k)
    )


def test_a_sampled_dtw_does_not_recompute_the_matrix_the_ari_never_reuses():
    cfg = replace(FAST, methods=("dtw",), dtw=DtwConfig(exact_max_n=10, sample_size=8))
    series = _series()
    prepared, lengths, fit, dist = method_inputs(series, "dtw", cfg)
    assert len(fit) == 8 and dist is None and prepared.shape[0] == series.n == len(lengths)
    sweep = sweep_methods(series, "s", cfg)
    k = sweep.best_k["dtw"]
    got = ari_of_labels(sweep.labels["dtw"][k], (prepared, lengths, fit, dist), "dtw", k, cfg, 2)
    assert got == ari_across_seeds(series, sweep, "dtw", k, cfg, 2)
