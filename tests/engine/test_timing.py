"""colibri.timing: interleaved rounds of functions in one process."""
from colibri import timing


def test_each_round_times_every_function_starting_one_later():
    order = []
    fns = {k: (lambda k=k: order.append(k)) for k in "abc"}
    per = timing.interleaved(fns, rounds=3, calls=2)
    assert set(per) == set("abc") and all(len(v) == 3 and min(v) >= 0 for v in per.values())
    # per function and round: 1 untimed call (calls // 10, at least one) and 2 timed ones
    rounds = [order[i:i + 9] for i in range(0, 27, 9)]
    assert [r[::3] for r in rounds] == [list("abc"), list("bca"), list("cab")]


def test_time_calls_is_the_median_of_the_timed_calls():
    import time

    n = []

    def f():
        n.append(1)
        time.sleep(0.0 if len(n) % 2 else 0.002)  # the timed calls 2..6: 3 of 5 sleep
    t = timing.time_calls(f, 5)
    assert len(n) == 1 + 5 and 0.0015 < t < 0.05
