"""bench.convergence refuses settings it cannot run (its runs take minutes: the figures come from bench/)."""

import pytest

from bench import convergence
from bench.precision import curves


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["--kernels", "avx2"], "ATEN:ONEDNN pairs"), (["--epochs", "0"], "1 or more"), (["--recipe", "x"], "choice")],
)
def test_convergence_bench_refuses_bad_arguments(arguments, message, capsys):
    with pytest.raises(SystemExit) as refused:
        convergence.main(arguments)
    assert refused.value.code == 2 and message in capsys.readouterr().err


def test_curves_line_up_under_long_setting_names():
    table = curves({"avx512:AVX512_CORE_AMX": {"curve": [(1, 0.5), (2, 0.75)]}, "avx2:AVX2": {"curve": [(1, 0.25)]}})
    lines = table.splitlines()
    assert len({len(line) for line in lines}) == 1  # every row as wide as the header
    assert lines[2].split() == ["2", "0.7500", "-"]
