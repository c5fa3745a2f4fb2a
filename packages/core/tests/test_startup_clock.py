"""The start-up line: each part's seconds in the order they ended, and their sum."""

import re
import time

from falconet.training.startup_clock import StartupClock, process_age


def test_parts_in_order_with_repeats_added_up():
    clock = StartupClock()
    time.sleep(0.02)
    clock.mark("data")
    time.sleep(0.01)
    clock.mark("network")
    time.sleep(0.01)
    clock.mark("data")
    names = [name for name, _ in clock.parts]
    assert names == ["data", "network"]
    seconds = dict(clock.parts)
    assert seconds["data"] >= 0.03 and seconds["network"] >= 0.01
    line = clock.summary(age=12.5)
    total = float(re.match(r"start-up (\d+\.\d+) s: ", line).group(1))
    assert abs(total - sum(seconds.values())) < 0.01
    assert line.endswith("(process age 12.50 s)")
    assert "data " in line and ", network " in line


def test_process_age_is_this_process_s():
    age = process_age()
    assert age is None or 0 < age < 24 * 3600

