"""The benchmarks' projections: the arithmetic, and (slow) the projection against a measured run."""

import argparse

import pytest


def test_project_fit_recovers_a_linear_stage_and_keeps_a_noisy_one_fixed(benchmark_module):
    fit = benchmark_module("bench_ec").project_fit(
        {
            100: {("dtw", "sweep"): 12.0, ("aggregate", "table1"): 5.0},
            200: {("dtw", "sweep"): 22.0, ("aggregate", "table1"): 4.0},
        },
        [100, 200],
    )
    assert fit[("dtw", "sweep")] == pytest.approx((2.0, 0.1))
    assert fit[("aggregate", "table1")] == (5.0, 0.0)  # shrank between the sizes: noise, taken as fixed


def test_profile_settings_read_the_profile_yaml(benchmark_module):
    bench = benchmark_module("bench_ec")
    settings = bench.profile_settings("sample")
    assert (settings.ec.k_min, settings.ec.k_max, settings.gain.n_seeds) == (3, 5, 8)
    quick = bench.profile_settings("quick")  # extends sample: its own n_init, the sample's k range and seeds
    assert (quick.ec.n_init, quick.ec.k_max, quick.gain.n_seeds, quick.gain.n_control_draws) == (10, 5, 8, 5)
    with pytest.raises(SystemExit, match="unknown profile 'nope'"):
        bench.profile_settings("nope")


@pytest.mark.slow
def test_ec_stage_projection_within_20_percent_of_a_measured_run(benchmark_module):
    from models.ec_mapping import EcRunSettings
    from models.forecaster import ForecasterConfig
    from models.prediction_gain import GainConfig
    from pipelines.equivalence import DtwConfig, EcConfig

    bench = benchmark_module("bench_ec")
    fc = ForecasterConfig(
        window=12, conv_channels=4, hidden_size=4, epochs=1, min_steps=4, max_train_windows=64
    )
    settings = EcRunSettings(
        # sample caps below the measured sizes, as the benchmark asks: every part is then at most linear in n
        ec=EcConfig(
            k_min=3,
            k_max=4,
            n_init=4,
            silhouette_sample_size=30,
            dtw=DtwConfig(exact_max_n=30, sample_size=20),
        ),
        gain=GainConfig(n_seeds=2, n_control_draws=2, max_eval_bins=12, min_members=2, forecaster=fc),
        stability_shuffles=20,
    )
    a = argparse.Namespace(length=300, seed=0)
    bench.stage_seconds(40, a, settings)  # warm-up, as the benchmark does
    measured = {n: bench.stage_seconds(n, a, settings) for n in (40, 80)}
    fit = bench.project_fit(measured, [40, 80])
    got = sum(bench.stage_seconds(160, a, settings).values())
    want = sum(fixed + per * 160 for fixed, per in fit.values())
    assert abs(want / got - 1) <= 0.2, (want, got)
