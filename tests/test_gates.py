import pytest

from compress.errors import LlmpressError
from compress.eval.gates import check_gates, parse_gates


def test_gates_pass_and_fail():
    gates = parse_gates("kl<=0.05, ppl_ratio<1.05,top1>=0.9")
    verdicts = check_gates(gates, {"kl": 0.04, "ppl_ratio": 1.06, "top1": 0.9})
    assert [ok for _, _, ok in verdicts] == [True, False, True]
    assert str(gates[0]) == "kl<=0.05"


@pytest.mark.parametrize("expr", ["kl=<0.05", "kl<=", "kl<=0.05;top1>0.9", "klx<=1", ""])
def test_bad_gate_expressions(expr):
    with pytest.raises(LlmpressError):
        parse_gates(expr)
