"""`sim.tuning.ChoiceMemo`: a remembered validation choice is the choice validation makes, it is reused only under
the same inputs, and it saves the validation rollouts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import sim.policies as policies_module
from sim.config import SimConfig
from sim.jobs import JobBatch
from sim.policies import POLICIES
from sim.tuning import ChoiceMemo, FitContext, TuningConfig, sequence_returns

CFG = SimConfig(n_machines=4, max_steps=400)
TUNING = TuningConfig(min_observed=(0, 8), n_sigmas=(1.0, 3.0), fallbacks=("tetris", "first_fit"))


def _jobs(seed: int) -> JobBatch:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(4):
        seq, t = [], 0
        for j in range(12):
            t += int(rng.integers(0, 3))
            dur, hi = int(rng.integers(6, 20)), int(rng.integers(2, 5))
            usage = [[hi if a % 5 == 0 else 1, 1] for a in range(dur)]
            seq.append({"arrival_step": t, "usage": usage, "ec_label": j % 2, "workload_id": f"w{j % 5}"})
        rows.append(seq)
    return JobBatch.from_jobs(rows)


class _Labeller:
    """Stands for a labeller in the memo's key: only its fingerprint is read there."""

    def __init__(self, fingerprint: str | None) -> None:
        self._fingerprint = fingerprint

    def fingerprint(self) -> str | None:
        return self._fingerprint


def _count_plays(monkeypatch) -> list[int]:
    calls = [0]
    play = policies_module.play

    def counted(*args, **kwargs):
        calls[0] += 1
        return play(*args, **kwargs)

    monkeypatch.setattr(policies_module, "play", counted)
    return calls


def test_a_remembered_choice_is_the_choice_and_skips_validation(tmp_path, monkeypatch) -> None:
    memo, train = ChoiceMemo(tmp_path), _jobs(3)
    first = FitContext(cfg=CFG, train=train, tuning=TUNING, where="toy", memo=memo)
    chosen = POLICIES["n_sigma_observed"].fit(first)
    assert len(list(tmp_path.glob("*.json"))) == 2  # the fallback's choice and the rule's
    calls = _count_plays(monkeypatch)
    again = FitContext(cfg=CFG, train=train, tuning=TUNING, where="elsewhere", memo=memo)
    reused = POLICIES["n_sigma_observed"].fit(again)
    assert calls[0] == 0  # no validation rollout: neither the fallbacks' nor the candidates'
    assert again.choices == first.choices
    assert (reused.n_sigma, reused.mode) == (chosen.n_sigma, chosen.mode)
    val = first.split()[1]
    assert np.array_equal(
        sequence_returns(reused, CFG, val, TUNING.seed), sequence_returns(chosen, CFG, val, TUNING.seed)
    )
    # without a memo the choice (JSON's types aside) is the same: remembering changes nothing
    plain = FitContext(cfg=CFG, train=train, tuning=TUNING, where="toy")
    POLICIES["n_sigma_observed"].fit(plain)
    assert calls[0] > 0  # (the count sees validation's rollouts)
    rule = plain.choices["n_sigma_observed"]
    assert {k: rule[k] for k in ("n_sigma", "mode", "validation_return", "fallback")} == {
        k: first.choices["n_sigma_observed"][k] for k in ("n_sigma", "mode", "validation_return", "fallback")
    }


@pytest.mark.parametrize("change", ["train", "tuning", "simulator", "labeller"])
def test_a_choice_is_reused_only_under_the_same_inputs(tmp_path, change) -> None:
    memo = ChoiceMemo(tmp_path)
    base = FitContext(cfg=CFG, train=_jobs(3), tuning=TUNING, memo=memo, labeller=_Labeller("a"))
    key = base.memo_key("choose n_sigma_observed", ["knobs"])
    other = {
        "train": {"train": _jobs(4)},
        "tuning": {"tuning": replace(TUNING, seed=1)},
        "simulator": {"cfg": replace(CFG, n_machines=5)},
        "labeller": {"labeller": _Labeller("b")},
    }[change]
    same = {"cfg": CFG, "train": _jobs(3), "tuning": TUNING, "memo": memo, "labeller": _Labeller("a")}
    assert FitContext(**same | other).memo_key("choose n_sigma_observed", ["knobs"]) != key
    assert base.memo_key("choose n_sigma_observed", ["other knobs"]) != key
    assert FitContext(**same).memo_key("choose n_sigma_observed", ["knobs"]) == key


def test_nothing_is_remembered_for_what_cannot_say_what_it_is(tmp_path) -> None:
    memo, train = ChoiceMemo(tmp_path), _jobs(3)
    assert FitContext(cfg=CFG, train=train, memo=memo, labeller=_Labeller(None)).memo_key("x") is None
    assert FitContext(cfg=CFG, train=train).memo_key("x") is None  # no memo
    # a forecaster fitted by a factory without an identity: its rules' choices are not remembered
    ctx = FitContext(cfg=CFG, train=train, memo=memo, forecaster_factory=lambda fit, cfg: object())
    assert ctx.memo_key("x") is not None
    ctx.forecaster()
    assert ctx.memo_key("x") is None


def test_an_unreadable_memo_file_is_a_miss(tmp_path) -> None:
    memo, train = ChoiceMemo(tmp_path), _jobs(3)
    ctx = FitContext(cfg=CFG, train=train, tuning=TUNING, memo=memo)
    POLICIES["n_sigma_observed"].fit(ctx)
    for path in tmp_path.glob("*.json"):
        path.write_text("{not json")
    again = FitContext(cfg=CFG, train=train, tuning=TUNING, memo=memo)
    POLICIES["n_sigma_observed"].fit(again)
    assert again.choices == ctx.choices


def test_tuning_settings_name_what_is_wrong() -> None:
    with pytest.raises(ValueError, match=r"TuningConfig.fallbacks must name one or more of .*'spread_out'"):
        TuningConfig(fallbacks=("tetris", "spread_out"))
    with pytest.raises(ValueError, match="TuningConfig.fallbacks"):
        TuningConfig(fallbacks=())
    with pytest.raises(ValueError, match="overshoot_budget_pct must be >= 0"):
        TuningConfig(overshoot_budget_pct=-1.0)
