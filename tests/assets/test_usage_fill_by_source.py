"""Gap filling can differ by source: the paper profile fills Bitbrains' 1-2 bin gaps and nothing else."""

from pathlib import Path

import pytest
import yaml

from assets.core import UsageRunConfig, usage_config_for

PAPER = Path(__file__).resolve().parents[2] / "assets" / "paper_config.yaml"


def test_a_source_uses_its_own_fill_settings_and_the_others_the_common_ones():
    config = UsageRunConfig(
        fill_policy="hold",
        max_fill_bins=12,
        fill_policy_by_source={"bitbrains": "linear"},
        max_fill_bins_by_source={"bitbrains": 2, "alibaba2018": 0},
    )
    bb, ali, google = (usage_config_for(config, s) for s in ("bitbrains", "alibaba2018", "google2011"))
    assert (bb.fill_policy, bb.max_fill_bins) == ("linear", 2)
    assert (ali.fill_policy, ali.max_fill_bins) == ("hold", 0)
    assert (google.fill_policy, google.max_fill_bins) == ("hold", 12)


def test_the_paper_profile_fills_only_bitbrains_short_gaps():
    ops = yaml.safe_load(PAPER.read_text())["ops"]["core__usage"]["config"]
    config = UsageRunConfig(**ops)
    bb = usage_config_for(config, "bitbrains")
    assert (bb.fill_policy, bb.max_fill_bins) == ("linear", 2)
    for source in ("google2011", "alibaba2018", "google2011_derived"):
        cfg = usage_config_for(config, source)
        assert (cfg.fill_policy, cfg.max_fill_bins) == ("none", 0)


def test_a_bad_per_source_setting_is_an_error():
    config = UsageRunConfig(max_fill_bins_by_source={"bitbrains": -1})
    with pytest.raises(ValueError, match="source 'bitbrains'.*max_fill_bins=-1"):
        usage_config_for(config, "bitbrains")
