"""exporter/steadyclock.py: the sidecar's clock never steps back and never falls behind the wall clock."""
from exporter.steadyclock import SLEW, SteadyClock


class Fake:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def test_a_wall_clock_stepped_back_is_slewed_toward_never_stepped_back():
    wall, mono = Fake(1_000_000.0), Fake(50.0)
    clock = SteadyClock(wall, mono)
    assert clock() == 1_000_000.0
    readings = []
    wall.t -= 600.0  # NTP steps it back 10 minutes
    for _ in range(100):
        wall.t += 5.0
        mono.t += 5.0
        readings.append(clock())
    steps = [b - a for a, b in zip([1_000_000.0] + readings, readings)]
    assert all(abs(step - 5.0 * (1 - SLEW)) < 1e-6 for step in steps)  # on at 99% pace: windows go on
    assert abs(readings[-1] - wall.t - (600.0 - 500.0 * SLEW)) < 1e-6  # 5 s of the 600 won back in 500 s
    assert all(r >= wall.t - 500.0 for r in readings)


def test_a_wall_clock_stepped_forward_is_followed_at_once():
    wall, mono = Fake(1_000_000.0), Fake(50.0)
    clock = SteadyClock(wall, mono)
    clock()
    wall.t += 3600.0 + 5.0  # a VM resumed after an hour: the monotonic clock did not count it
    mono.t += 5.0
    assert clock() == wall.t


def test_it_goes_at_the_monotonic_pace_while_the_wall_clock_agrees():
    wall, mono = Fake(1_000_000.0), Fake(50.0)
    clock = SteadyClock(wall, mono)
    for _ in range(10):
        wall.t += 1.0
        mono.t += 1.0
        assert clock() == wall.t
