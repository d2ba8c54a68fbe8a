"""What `tvw-run` refuses before it makes any run, as a real process: a second tvw-run on the warehouse of one in
progress (at once, naming the first, which then completes normally), and a profile with a mistyped value (in
under 30 s, one line naming the key). tests/cli/test_run.py checks the same refusals in-process."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.slow

LAYERS, SOURCES = "raw,per_source", "google2011_derived"


def test_a_second_tvw_run_on_the_same_warehouse_exits_at_once_naming_the_first(tmp_path, tvw):
    home, wh = tmp_path / "home", tmp_path / "wh"
    cmd = tvw.command(tvw.FIXTURES, wh, "sample", LAYERS, SOURCES, 2)
    first = tvw.start(cmd, home)
    tvw.wait_for(lambda: tvw.lock_holder(wh), first, "the first tvw-run's lock")
    t0 = time.perf_counter()
    second = tvw.run(cmd, home, timeout=120)
    took = time.perf_counter() - t0
    # refused (2), naming the first's pid: the first held the lock when the second checked. Whether the first is
    # still running when the second has exited depends on how busy the machine is (on 2 busy cores the first's
    # two layers have finished before the second's imports), so that is not asserted.
    assert second.returncode == 2, second.stdout + second.stderr
    err = second.stderr.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in second.stderr, second.stderr
    assert f"another tvw-run (pid {first.pid} on " in err[0] and str(wh) in err[0]
    assert "[1/" not in second.stdout  # it made no run
    assert took < 60, f"the refusal took {took:.0f} s"
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out
    assert "finished in" in out and "per_source    1 run(s), 0 failed" in out, out


def refused_profile(tmp_path, tvw, yaml_text: str) -> tuple[list[str], float]:
    """tvw-run with the profile `yaml_text`: refused (exit 2) with no output but stderr, before any warehouse or
    Dagster storage exists; (stderr's lines, seconds it took)."""
    profile = tmp_path / "typo.yaml"
    profile.write_text(yaml_text)
    home, wh = tmp_path / "home", tmp_path / "wh"
    cmd = tvw.command(tvw.FIXTURES, wh, str(profile), "raw,per_source,ec_sweep", SOURCES, 2)
    t0 = time.perf_counter()
    done = tvw.run(cmd, home, timeout=120)
    took = time.perf_counter() - t0
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""  # not even the plan
    assert not wh.exists() and not (home / "history").exists()  # no warehouse, no Dagster storage
    return done.stderr.strip().splitlines(), took


def test_a_mistyped_profile_value_fails_in_under_30_s_naming_the_key_before_any_run(tmp_path, tvw):
    err, took = refused_profile(
        tmp_path,
        tvw,
        "extends: sample\nops:\n  core__usage:\n    config:\n      usage:\n        max_fill_bins: twelve\n",
    )
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert "ops.core__usage.config.usage.max_fill_bins" in err[0] and "twelve" in err[0], err[0]
    assert took < 30, f"the refusal took {took:.1f} s"


def test_a_mistyped_value_in_the_shared_ec_entry_is_named_as_the_profile_writes_it(tmp_path, tvw):
    err, _ = refused_profile(
        tmp_path,
        tvw,
        "extends: sample\nops:\n  ec__mapping:\n    config:\n      ec:\n        k_max: fifteen\n",
    )
    assert len(err) == 1 and "fifteen" in err[0], err
    assert "ops.ec__mapping.config.ec.k_max" in err[0], err[0]
