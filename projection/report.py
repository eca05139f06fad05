"""What every family's report prints alike: its step time, term by term, in one table."""

from __future__ import annotations


def step_table(
    global_batch: int, terms: dict[str, float], device_s: float, feed: str, feed_s: float, width: int
) -> list[str]:
    """The step's terms in ms, the device's total, and the host's feed (overlapped with the step), each name padded
    to `width`."""
    lines = [f"step time, ms (global batch {global_batch:,})"]
    lines += [f"  {name:<{width}}{1e3 * seconds:>10.3f}" for name, seconds in terms.items()]
    lines.append(f"  {'device, total':<{width}}{1e3 * device_s:>10.3f}")
    lines.append(f"  {feed:<{width}}{1e3 * feed_s:>10.3f}")
    return lines
