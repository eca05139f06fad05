"""A simulated system's clock: what its devices would have spent, not what the host took to simulate them."""

from __future__ import annotations

import time
from typing import Any


class DeviceClock:
    """Starts at the wall time it is made (so it follows the host's log lines before it) and then moves only by
    the cost model's time: `step_s` per weight update of `images` and `eval_image_s` per validation image, on
    `system` (as a run's lines name it).

    The host hands the devices `steps_per_call` steps at a time (None: a whole epoch) and sees them again when the
    call ends, so the time `now_s` shows moves by a whole call at its end: its steps and the call's own `call_s`.
    A call ends after its steps, or sooner at `end_call` (the loop's epoch end)."""

    def __init__(
        self,
        step_s: float,
        eval_image_s: float,
        images: int = 0,
        system: str = "",
        steps_per_call: int | None = 1,
        call_s: float = 0.0,
    ) -> None:
        self.step_s = step_s
        self.eval_image_s = eval_image_s
        self.images = images
        self.system = system
        self.steps_per_call = steps_per_call
        self.call_s = call_s
        self.in_call = 0  # steps taken in the call under way
        self.now_s = self.started_s = time.time()

    @property
    def img_s(self) -> float:
        """The system's training throughput: an update's images over its step."""
        return self.images / self.step_s

    @property
    def elapsed_s(self) -> float:
        """The simulated seconds since the clock started: the run's, as no step runs before run_start."""
        return self.now_s - self.started_s

    def step(self) -> None:
        self.in_call += 1
        if self.in_call == self.steps_per_call:
            self.end_call()

    def end_call(self) -> None:
        """The call under way returns to the host: its steps and its own cost show (nothing, between calls)."""
        if self.in_call:
            self.now_s += self.in_call * self.step_s + self.call_s
            self.in_call = 0

    def evaluate(self, images: int) -> None:
        self.now_s += images * self.eval_image_s

    def state_dict(self) -> dict[str, Any]:
        """The clock between calls, where a run checkpoints (the host holds no state of a call under way)."""
        assert self.in_call == 0, "a checkpoint falls between host calls"
        return {"now_s": self.now_s, "started_s": self.started_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.now_s, self.started_s = state["now_s"], state["started_s"]
