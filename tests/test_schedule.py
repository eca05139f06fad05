import itertools
import math

import pytest

from optim.config import OptimConfig
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


def test_every_step_of_a_small_schedule_by_hand():
    """Base 8 over 4 warm-up steps, then 8 steps of quadratic decay from base to end 0.5: each lr worked out by hand
    (8 / 4 per warm-up step; 0.5 + 7.5 (1 - k/8)^2 at decay step k), every one exact in binary."""
    small = Schedule(base_lr=8.0, warmup_steps=4, decay_steps=8, end_lr=0.5)
    warmup = [2.0, 4.0, 6.0, 8.0]
    decay = [8.0, 6.2421875, 4.71875, 3.4296875, 2.375, 1.5546875, 0.96875, 0.6171875, 0.5, 0.5]
    assert [small(step) for step in range(14)] == warmup + decay
    linear = Schedule(base_lr=8.0, warmup_steps=4, decay_steps=8, end_lr=0.5, power=1.0)
    assert [linear(step) for step in range(4, 13, 2)] == [8.0, 6.125, 4.25, 2.375, 0.5]


def test_a_runs_schedule_warms_up_then_decays_over_the_rest_of_its_epochs():
    """Schedule.for_run in steps: the warm-up epochs, then the decay over optim.decay_epochs or, without it, every
    epoch after warm-up, so the decay ends with the epoch budget (its last step's lr just above end_lr); epochs
    rounded to whole steps."""
    optim = OptimConfig(base_lr=2.0, warmup_epochs=1.5, end_lr=0.01, poly_power=3.0)
    run = Schedule.for_run(optim, max_epochs=10, steps_per_epoch=4)
    assert run == Schedule(base_lr=2.0, warmup_steps=6, decay_steps=34, end_lr=0.01, power=3.0)
    assert run(10 * 4 - 1) > 0.01 and run(10 * 4) == 0.01
    optim.decay_epochs = 4.0
    assert Schedule.for_run(optim, max_epochs=10, steps_per_epoch=4).decay_steps == 16
    optim.warmup_epochs, optim.decay_epochs = 0.5, None
    assert Schedule.for_run(optim, max_epochs=10, steps_per_epoch=5).warmup_steps == 3  # 2.5 steps: halves up
    optim.decay_epochs = 0.1
    assert Schedule.for_run(optim, max_epochs=10, steps_per_epoch=4).decay_steps == 1  # 0.4 steps: never 0


def test_no_warmup():
    assert learning_rate(0, base_lr=BASE, warmup_steps=0, decay_steps=DECAY) == BASE


def test_rejects_bad_arguments():
    with pytest.raises(ValueError):
        learning_rate(0, base_lr=BASE, warmup_steps=WARMUP, decay_steps=0)


def test_steps_from_epochs():
    assert steps_from_epochs(5, 1251) == 6255
    assert steps_from_epochs(0.5, 3) == 2
    assert steps_from_epochs(0.4, 3) == 1
