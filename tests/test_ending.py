"""ending.py's table of endings: README.md, docs/running.md and ending.py's docstring say what it says, the rooms
below it raise what it maps to each status, and train.py's exit is the table's status and line."""

import errno
import re
import signal
from pathlib import Path

import pytest

import ending
from configs.checks import ConfigError
from distributed import PeerLost
from rundir import StorageError
from stopsignals import StopRequested
from tests.conftest import REPO

LABEL = re.compile(r"(\d+(?: \+ N)?) (.*)", re.DOTALL)


def label(end: ending.Ending) -> str:
    """The status as the pages write it: `3`, or `128 + N` for a stop."""
    return f"{end.status} + N" if end.by_signal else str(end.status)


def meanings() -> dict[str, list[str]]:
    """What the table says each status means, by its label (1 means two things)."""
    found: dict[str, list[str]] = {}
    for end in ending.ENDINGS:
        found.setdefault(label(end), []).append(end.means)
    return found


def outside_parentheses(text: str, separator: str) -> list[str]:
    """`text` split at each `separator` that stands outside parentheses."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and text.startswith(separator, at):
            parts.append(text[start:at])
            start = at + len(separator)
    return [*parts, text[start:]]


def readme_statuses() -> tuple[dict[str, str], str]:
    """The README's sentence of exit statuses, by label (`0 it reached the target, 1 ...`), and its last item's
    parenthesis, which says which statuses resume."""
    page = " ".join((REPO / "README.md").read_text().split())
    sentence = outside_parentheses(page.split("The exit status says how a run ended: ", 1)[1], ". ")[0]
    items = outside_parentheses(sentence, ", ")
    parsed = [LABEL.fullmatch(item) for item in items]
    assert all(parsed), items
    return {match[1]: match[2] for match in parsed if match}, items[-1]


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table under `header` in `text`."""
    lines = text.split(header, 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


def test_every_status_the_readme_lists_is_the_tables_with_its_meaning():
    listed, last = readme_statuses()
    assert sorted(listed) == sorted(meanings())
    for status, words in listed.items():
        assert all(means in words for means in meanings()[status]), (status, words)
    resuming = re.search(r"after (.*), its checkpoint resumes it", last)
    assert resuming is not None, last
    said = set(re.split(r", | and ", resuming[1]))
    assert said == {label(end) for end in ending.ENDINGS if end.resumes}


def test_running_md_lists_the_tables_statuses_with_their_meanings():
    page = (REPO / "docs" / "running.md").read_text()
    rows = table_rows(page.split("## Exit status", 1)[1], "| status | the run |\n")
    assert [status for status, _ in rows] == list(meanings())
    for status, words in rows:
        assert all(means in words for means in meanings()[status]), (status, words)


def test_endings_docstring_table_is_the_table():
    assert ending.__doc__ is not None
    rows = table_rows(ending.__doc__, "| exit status | the run | its checkpoint resumes it |\n")
    assert rows == [[label(end), end.means, "yes" if end.resumes else "no"] for end in ending.ENDINGS]


def test_the_rooms_below_raise_what_the_table_maps_to_their_status():
    stop = StopRequested(signal.SIGTERM)
    assert ending.ending_of(stop) is ending.STOPPED
    assert stop.code == ending.STOPPED.status + signal.SIGTERM == 143
    assert ending.ending_of(PeerLost("rank 1 died")) is ending.LOST_RANK
    assert PeerLost.exit_status == ending.LOST_RANK.status == 4  # the SLURM launcher exits with it
    assert ending.ending_of(StorageError(Path("x"), "no space left", Path("/"), None, None, 0)).status == 5
    assert ending.ending_of(ConfigError("run.seed", "wrong")) is ending.REFUSED
    assert ending.ending_of(RuntimeError("a bug")) is ending.BUG
    assert len({end.means for end in ending.ENDINGS}) == len(ending.ENDINGS)


@pytest.mark.parametrize(
    ("err", "status", "line"),
    [
        (ConfigError("run.seed", "expects an integer"), 2, "error: run.seed: expects an integer\n"),
        (ending.NotConverged(0.5), 3, "not converged: the run ended short of the target top-1 0.5 (exit status 3; "),
        (PeerLost("rank 1 stopped stamping"), 4, "error: rank 1 stopped stamping\n"),
        (StorageError(Path("x"), "no space left", Path("/"), None, None, 0), 5, ""),  # rank 0 said it before
    ],
)
def test_a_run_leaves_with_its_endings_status_and_line(err, status, line, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as left:
        ending.leave(err, tmp_path)
    assert left.value.code == status
    printed = capsys.readouterr().err
    assert printed.startswith(line) if line else printed == ""


def test_an_oserror_the_run_raised_is_not_hydras_failed_write():
    """Hydra's making of the run directory comes before the run: its OSError, or logging's ValueError over one, is
    refused in one line; the same error raised by the run is a bug, raised on with its traceback."""
    unwritable = OSError(errno.EROFS, "Read-only file system", "/scratch/run")
    assert ending.hydras_failed_write(unwritable) is unwritable
    wrapped = ValueError("Unable to configure handler 'file'")
    wrapped.__cause__ = unwritable
    assert ending.hydras_failed_write(wrapped) is unwritable
    with pytest.raises(OSError) as raised, ending.raised_in_the_run():
        raise unwritable
    assert ending.hydras_failed_write(raised.value) is None
    with ending.raised_in_the_run():  # the next job's run raises nothing: Hydra's error is Hydra's again
        pass
    assert ending.hydras_failed_write(unwritable) is unwritable


def test_a_sweep_with_no_best_trial_exits_1_with_its_line(capsys):
    with pytest.raises(SystemExit) as left:
        ending.leave_before_the_run(ValueError(ending.NO_TRIAL_COMPLETED))
    assert left.value.code == ending.NO_BEST_TRIAL.status == 1
    assert capsys.readouterr().err == f"{ending.NO_BEST_TRIAL.line}\n"
