"""The capacity planner (python -m projection.plan): its binary search against every size tried in turn, on two
systems of each family; each printed command giving its row's figures through train.py's projection; the command
line's table, the systems that cannot reach the time, and the JSON line last."""

from __future__ import annotations

import csv
import json

import pytest

from configs.schema import batch_shape
from projection import plan
from projection.families import answer
from tests.conftest import composed


def system(name: str) -> plan.System:
    return next(each for each in plan.systems() if each.name == name)


def found(row: plan.Row | None) -> tuple[int, int, float] | None:
    return None if row is None else (row.size.chips, row.global_batch, row.minutes(central=False))


def every_size_in_turn(search: plan.Search, minutes: float) -> plan.Row | None:
    """The smallest size within `minutes`, by projecting each size from the smallest up."""
    return next((search.at(i) for i in range(len(search.sizes)) if search.reaches(i, minutes)), None)


@pytest.mark.parametrize(
    ("name", "minutes"),
    [
        ("tpu_v4", 2),
        ("tpu_v5e", 10),
        pytest.param("dgx_h100", 10, marks=pytest.mark.slow),  # 4 to 20 s each: a hundred projections or more
        pytest.param("dgx_h100", 2, marks=pytest.mark.slow),
        pytest.param("pcie_l40s", 10, marks=pytest.mark.slow),
        pytest.param("ipu_pod", 10, marks=pytest.mark.slow),  # each IPU projection plans its memory
        pytest.param("bow_pod", 6, marks=pytest.mark.slow),
    ],
)
def test_the_search_finds_the_size_that_trying_every_size_in_turn_finds(name, minutes):
    searched = plan.Search.of(system(name), central=False).smallest(minutes)
    assert searched is not None and searched.minutes(central=False) <= minutes
    assert found(searched) == found(every_size_in_turn(plan.Search.of(system(name), central=False), minutes))


def test_a_rows_printed_command_gives_its_figures():
    """The command, composed as train.py composes it, projects the row's time to train and throughput."""
    row = plan.Search.of(system("dgx_h100"), central=False).smallest(10)
    assert row is not None
    assert row.command == (
        "train.py run.mode=project experiment=imagenet device=dgx_h100 device.nodes=2 data.global_batch=3264"
    )
    overrides = row.command.split()[1:]
    cfg = composed(*overrides)
    figures = json.loads(answer(cfg, batch_shape(cfg, 1), overrides).splitlines()[-1])
    assert figures == row.figures


def test_the_command_line_prints_a_row_a_system_and_those_that_cannot_then_json(capsys, tmp_path):
    plan.main(["--minutes", "0.05", "--system", "dgx_h100", "--system", "tpu_v4", "--out", str(tmp_path / "a")])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ImageNet to MLPerf's target within 0.05 min at the 80 % range's upper end")
    assert "dgx_h100: its largest configuration (8,480 chips) cannot train in 0.05 min" in out
    plan.main(["--minutes", "10", "--system", "dgx_h100", "--system", "tpu_v4", "--out", str(tmp_path / "b")])
    out = capsys.readouterr().out.splitlines()
    rows = json.loads(out[-1])["rows"]
    assert [(row["family"], row["system"]) for row in rows] == [("gpu", "dgx_h100"), ("tpu", "tpu_v4")]
    keys = {"chips", "global_batch", "time_to_train_min", "time_to_train_min_range", "command"}
    assert all(keys <= row.keys() and row["time_to_train_min_range"][1] <= 10 for row in rows)
    assert f"  {rows[0]['command']}" in out
    assert out[-2] == f"outputs: {tmp_path / 'b'} (plan.csv: the table; plan.png: time to train against chips)"
    with (tmp_path / "b" / "plan.csv").open() as file:
        table = list(csv.DictReader(file))
    assert [(r["system"], int(r["chips"]), r["command"]) for r in table] == [
        (row["system"], row["chips"], row["command"]) for row in rows
    ]
    assert (tmp_path / "b" / "plan.png").read_bytes().startswith(b"\x89PNG")


def test_a_folder_holding_the_planners_files_is_refused_in_one_line_and_left_as_it_was(tmp_path, capsys):
    (tmp_path / "plan.csv").write_text("a user's table\n")
    with pytest.raises(SystemExit) as refused:
        plan.main(["--chips", "8", "--system", "tpu_v4", "--out", str(tmp_path)])
    assert refused.value.code == 2
    assert capsys.readouterr().err == (
        f"error: --out {tmp_path} already holds plan.csv; give a new --out (nothing was changed)\n"
    )
    assert [path.name for path in tmp_path.iterdir()] == ["plan.csv"]
    assert (tmp_path / "plan.csv").read_text() == "a user's table\n"


def test_at_a_size_each_system_gives_its_time_at_the_next_size_it_offers(capsys, tmp_path):
    plan.main(["--chips", "100", "--system", "tpu_v4", "--out", str(tmp_path)])
    (row,) = json.loads(capsys.readouterr().out.splitlines()[-1])["rows"]
    assert row["chips"] == 128 and "device.chips=128" in row["command"]
