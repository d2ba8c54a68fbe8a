"""The EC method sweep fans out: the runs tvw-run plans from the definitions and their waits, and the one config
the profile gives the sweep, gain and choice steps (derived from models.ec_mapping.EcRunSettings)."""

from pathlib import Path

import pytest

from assets.definitions import build_definitions, load_profile
from assets.ec import CLASSIFIER_RUN, EC_RUN, ec__mapping
from assets.jobs import SHARED_CONFIG, planned_partitions
from assets.settings import apply_profile, resolved_config
from cli.plan import plan, ready
from models.ec_classifier import ClassifierRunSettings
from models.ec_mapping import EcRunSettings
from pipelines.profiles import ProfileError, with_shared_entries
from pipelines.settings import find_setting

FIXTURES = Path(__file__).parents[1] / "fixtures" / "traces"
EC_LAYERS = ("per_source", "ec_sweep", "ec_gain", "ec", "cluster")
EC_OPS = ("ec__method_sweep", "ec__method_gain", "ec__mapping")


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return build_definitions(FIXTURES, tmp_path_factory.mktemp("warehouse"), "sample")


def _assets(defs):
    return {a.node_def.name: a for a in defs.assets if hasattr(a, "node_def")}


def _runs(defs, sources):
    return plan(defs, EC_LAYERS, sources, planned_partitions(defs))


def test_the_ec_layers_plan_a_run_per_source_and_configured_method(sample):
    runs = _runs(sample, ["bitbrains", "alibaba2018"]).runs
    sweeps = sorted(r.partition for r in runs if r.layer == "ec_sweep")
    assert sweeps == sorted(
        f"{m}|{s}" for s in ("bitbrains", "alibaba2018") for m in ("aggregate", "temporal", "dtw")
    )
    assert sorted(r.partition for r in runs if r.layer == "ec") == ["alibaba2018", "bitbrains"]
    # the runner reads the methods at their settings path, ops.ec__mapping.config.ec.methods
    two = apply_profile([ec__mapping], {"ec__mapping": {"config": {"ec": {"methods": ["temporal", "dtw"]}}}})
    assert find_setting(resolved_config(two[0]), "methods") == ["temporal", "dtw"]


def test_an_ec_run_waits_only_for_the_earlier_ec_runs_of_its_own_source(sample):
    runs = _runs(sample, ["bitbrains", "alibaba2018"])
    spec = {r.label: r for r in runs.runs}
    sweep, other_sweep = spec["ec_sweep_job[dtw|bitbrains]"], spec["ec_sweep_job[dtw|alibaba2018]"]
    gain, choice = spec["ec_gain_job[aggregate|bitbrains]"], spec["ec_job[bitbrains]"]
    assert spec["per_source_job[bitbrains]"] in runs.waits[sweep]
    assert spec["per_source_job[alibaba2018]"] not in runs.waits[sweep]
    # the gain of one method needs every method's sweep of its source (the common k), not other sources'
    assert sweep in runs.waits[gain] and other_sweep not in runs.waits[gain]
    assert spec["ec_gain_job[dtw|bitbrains]"] in runs.waits[choice]
    assert not {r for r in runs.waits[choice] if r.source == "alibaba2018"}
    assert not ready(choice, runs, set(runs.waits[choice]) - {spec["ec_gain_job[dtw|bitbrains]"]})


@pytest.mark.parametrize("profile", ["sample", "paper"])
def test_the_profile_configures_the_ec_layer_once(tmp_path, profile):
    ops = load_profile(profile)["ops"]
    shared = with_shared_entries(ops, SHARED_CONFIG)
    assert shared["ec__method_sweep"] == shared["ec__method_gain"] == ops["ec__mapping"]
    own = {"ec__mapping": ops["ec__mapping"], "ec__method_gain": {"config": {"ec": {"n_init": 2}}}}
    assert with_shared_entries(own, SHARED_CONFIG)["ec__method_gain"] == {
        "config": {"ec": {"n_init": 2}}
    }  # given: kept
    assets = _assets(build_definitions(FIXTURES, tmp_path, profile))
    configs = [resolved_config(assets[op]) for op in EC_OPS]
    assert configs[0] == configs[1] == configs[2]
    settings = EC_RUN(**configs[0]).build()
    assert settings == EC_RUN(**ops["ec__mapping"]["config"]).build()
    assert isinstance(settings, EcRunSettings)
    classifier = CLASSIFIER_RUN(**resolved_config(assets["ec__classifier_accuracy"])).build()
    assert isinstance(classifier, ClassifierRunSettings)


def test_the_profiles_values_are_in_force_under_the_settings_names():
    sample = EC_RUN(**load_profile("sample")["ops"]["ec__mapping"]["config"]).build()
    assert (sample.ec.k_max, sample.ec.n_init, sample.ec.dtw.window_frac, sample.ec.dtw.downsample) == (
        5,
        50,
        0.1,
        12,
    )
    gain = sample.gain_config()
    assert (gain.n_seeds, gain.n_control_draws, gain.max_eval_bins, gain.min_members) == (8, 5, 24, 5)
    f = gain.forecaster
    assert (f.window, f.ar_window, f.conv_channels, f.hidden_size, f.epochs, f.min_steps) == (
        12,
        8,
        8,
        8,
        1,
        12,
    )
    assert f.max_train_windows == 256
    paper = EC_RUN(**load_profile("paper")["ops"]["ec__mapping"]["config"]).build().gain_config()
    assert (paper.forecaster.window, paper.forecaster.epochs, paper.n_seeds) == (168, 100, 10)
    classifier = CLASSIFIER_RUN(**load_profile("sample")["ops"]["ec__classifier_accuracy"]["config"]).build()
    assert (classifier.classifier.epochs, classifier.min_per_class, classifier.classifier.prefix_bins) == (
        40,
        3,
        12,
    )


def test_a_bad_ec_setting_is_a_profile_error_naming_it():
    with pytest.raises(ProfileError, match="forecaster_seeds"):
        apply_profile([ec__mapping], {"ec__mapping": {"config": {"forecaster_seeds": 8}}})
    with pytest.raises(ProfileError, match="train_frac"):
        apply_profile([ec__mapping], {"ec__mapping": {"config": {"ec": {"train_frac": 0.5}}}})
    with pytest.raises(ProfileError, match="forecaster_preset"):
        apply_profile([ec__mapping], {"ec__mapping": {"config": {"forecaster_preset": "huge"}}})
