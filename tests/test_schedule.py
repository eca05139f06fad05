import itertools
import math

import pytest

from optim.schedule import Schedule, learning_rate, steps_from_epochs

BASE, WARMUP, DECAY, END = 10.0, 50, 200, 1e-4
schedule = Schedule(base_lr=BASE, warmup_steps=WARMUP, decay_steps=DECAY, end_lr=END)


def test_warmup_starts_at_base_over_warmup_and_ends_at_base():
    assert schedule(0) == BASE / WARMUP
    assert schedule(WARMUP - 1) == BASE
    assert schedule(WARMUP) == BASE


def test_decay_ends_at_end_lr():
    assert schedule(WARMUP + DECAY - 1) == pytest.approx(END, abs=1e-3)
    assert schedule(WARMUP + DECAY - 1) > END
    assert schedule(WARMUP + DECAY) == END
    assert schedule(WARMUP + 10 * DECAY) == END


def test_monotone_decreasing_after_warmup():
    lrs = [schedule(s) for s in range(WARMUP, WARMUP + DECAY + 1)]
    assert all(a > b for a, b in itertools.pairwise(lrs))


def test_matches_formula_at_mid_point():
    step = WARMUP + 73
    expected = (BASE - END) * (1 - 73 / DECAY) ** 2 + END
    assert math.isclose(schedule(step), expected, rel_tol=1e-15)
    assert schedule(step) == learning_rate(step, base_lr=BASE, warmup_steps=WARMUP, decay_steps=DECAY)


def test_no_warmup():
    assert learning_rate(0, base_lr=BASE, warmup_steps=0, decay_steps=DECAY) == BASE


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        learning_rate(0, base_lr=BASE, warmup_steps=WARMUP, decay_steps=0)


def test_steps_from_epochs():
    assert steps_from_epochs(5, 1251) == 6255
    assert steps_from_epochs(0.5, 3) == 2
    assert steps_from_epochs(0.4, 3) == 1
