from pipelines.progress import Progress, format_seconds, track


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_lines_come_first_last_and_every_interval_with_rate_and_time_left():
    clock, lines = FakeClock(), []
    p = Progress(10, "fit", log=lines.append, every_s=5.0, unit="fits", clock=clock)
    for _ in range(10):
        clock.t += 1.0
        p.advance()
    # first item, then after 5 s (item 6), then the last (item 10)
    assert len(lines) == 3
    assert lines[0].startswith("fit: 1/10 fits (10 %), 1.0 fits/s")
    assert "9 s left" in lines[0]
    assert lines[1].startswith("fit: 6/10 fits")
    assert lines[-1].startswith("fit: 10/10 fits (100 %)") and lines[-1].endswith("0 s left")


def test_track_yields_every_item_and_logs_the_end():
    lines: list[str] = []
    assert list(track(range(4), "x", log=lines.append, every_s=1e9)) == [0, 1, 2, 3]
    assert lines[0].startswith("x: 1/4") and lines[-1].startswith("x: 4/4")


def test_format_seconds_picks_the_unit():
    assert format_seconds(12.4) == "12 s"
    assert format_seconds(185) == "3 min 05 s"
    assert format_seconds(7620) == "2 h 07 min"
    assert format_seconds(float("inf")) == "?"
