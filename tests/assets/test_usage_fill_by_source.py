"""Gap filling can differ by source: the paper profile fills Bitbrains' 1-2 bin gaps and nothing else."""

from pathlib import Path

import pytest
import yaml

from assets.core import UsageRunConfig, core__usage
from assets.settings import apply_profile
from pipelines.profiles import ProfileError
from pipelines.usage import UsageConfig, UsageRunSettings

PAPER = Path(__file__).resolve().parents[2] / "assets" / "paper_config.yaml"


def test_a_source_uses_its_own_fill_settings_and_the_others_the_common_ones():
    settings = UsageRunConfig(
        usage={"fill_policy": "hold", "max_fill_bins": 12},
        usage_by_source={"bitbrains": {"fill_policy": "linear", "max_fill_bins": 2}},
        chunk_hours={"google2011": 2},
    ).build()
    assert isinstance(settings, UsageRunSettings)
    assert settings.for_source("bitbrains") == UsageConfig("linear", 2)
    assert settings.for_source("google2011") == UsageConfig("hold", 12)
    assert settings.chunking("google2011") == {"chunk_s": 7200, "chunk_rows": None}
    assert settings.chunking("alibaba2018") == {"chunk_s": None, "chunk_rows": None}


def test_the_paper_profile_fills_only_bitbrains_short_gaps():
    ops = yaml.safe_load(PAPER.read_text())["ops"]["core__usage"]["config"]
    settings = UsageRunConfig(**ops).build()
    assert settings.for_source("bitbrains") == UsageConfig("linear", 2)
    for source in ("google2011", "alibaba2018", "google2011_derived"):
        assert settings.for_source(source) == UsageConfig("none", 0)


def test_a_bad_per_source_setting_is_an_error():
    with pytest.raises(ValueError, match="max_fill_bins=-1"):
        UsageRunConfig(usage_by_source={"bitbrains": {"max_fill_bins": -1}}).build()
    bad = {"core__usage": {"config": {"usage_by_source": {"bitbrains": {"max_fill_bins": -1}}}}}
    with pytest.raises(ProfileError, match="ops.core__usage.config"):
        apply_profile([core__usage], bad)
