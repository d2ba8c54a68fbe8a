"""The default `tvw-run` (quick profile, embedded sample) end to end, as a new user runs it: it succeeds, prints
the leaderboard, every README SQL block runs on its warehouse, and the leaderboard never calls an oracle best."""

import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

pytestmark = pytest.mark.integration  # about five minutes: the whole default run


def readme_sql_blocks() -> list[str]:
    return [b.strip() for b in re.findall(r"```sql\n(.*?)```", README.read_text(), flags=re.S)]


def test_the_readme_has_sql_blocks():
    assert len(readme_sql_blocks()) >= 3


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("default_run")
    env = {**os.environ, "DAGSTER_HOME": str(tmp / "home")}
    env.pop("TVW_PROFILE", None)
    env.pop("TVW_TRACE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-m", "cli.run", "--warehouse", str(tmp / "wh")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    return done, tmp / "wh"


def test_the_default_run_succeeds_and_prints_a_leaderboard(default_run):
    done, _ = default_run
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "profile:   quick" in done.stdout
    assert "leaderboard (episode_return" in done.stdout


@pytest.mark.parametrize("index", range(len(readme_sql_blocks())))
def test_every_readme_sql_block_runs_on_the_default_warehouse(default_run, index):
    _, wh = default_run
    sql = readme_sql_blocks()[index]
    with duckdb.connect(str(wh / "tvw.duckdb"), read_only=True) as con:
        rows = con.execute(sql).fetchall()
    assert rows, f"README SQL block {index} returned no row:\n{sql}"


def test_the_leaderboard_never_ranks_an_oracle(default_run):
    _, wh = default_run
    with duckdb.connect(str(wh / "tvw.duckdb"), read_only=True) as con:
        bad = con.execute(
            "select count(*) from eval__leaderboard where is_oracle and (rank is not null or is_best)"
        )
        assert bad.fetchone()[0] == 0
        best = con.execute("select count(*) from eval__leaderboard where is_best").fetchone()[0]
        cells = con.execute("select count(distinct (source, load_pct)) from eval__leaderboard").fetchone()[0]
    assert best == cells > 0
