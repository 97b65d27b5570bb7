import pytest

from compress.errors import LlmpressError
from compress.eval.gates import check_gates, load_gate_file, parse_gates

MEASURED = {
    "kl": 0.04,
    "ppl": 31.0,
    "base_ppl": 30.0,
    "ppl_ratio": 31 / 30,
    "top1": 0.9,
    "size_mb": 100.0,
    "base_size_mb": 540.0,
    "bits_per_weight": 5.9,
    "base_bits_per_weight": 32.0,
}


def test_gates_pass_and_fail():
    gates = parse_gates("kl<=0.05, ppl_ratio<1.03,top1>=0.9")
    verdicts = check_gates(gates, MEASURED)
    assert [v.passed for v in verdicts] == [True, False, True]
    assert str(gates[0]) == "kl<=0.05"


@pytest.mark.parametrize("expr", ["kl=<0.05", "kl<=", "kl<=0.05;top1>0.9", "klx<=1", ""])
def test_bad_gate_expressions(expr):
    with pytest.raises(LlmpressError):
        parse_gates(expr)


def test_gate_file_absolute_and_relative_rules(tmp_path):
    path = tmp_path / "gates.yaml"
    path.write_text(
        "kl: {max: 0.05}\n"
        "top1: {min: 0.95}\n"
        "ppl: {max_increase: 5%}\n"
        "size_mb: {max_increase: -75%}\n"  # at most a quarter of the original
    )
    verdicts = check_gates(load_gate_file(path), MEASURED)
    assert [(v.gate.metric, v.passed) for v in verdicts] == [
        ("kl", True),
        ("top1", False),
        ("ppl", True),
        ("size_mb", True),
    ]
    ppl = verdicts[2]
    assert ppl.gate.threshold == pytest.approx(31.5)
    assert ppl.line() == "PASS ppl = 31 (limit <= 31.5) [original 30 +5.0% (max_increase)]"
    assert verdicts[3].gate.threshold == pytest.approx(135.0)
    assert verdicts[1].to_dict() == {
        "metric": "top1",
        "value": 0.9,
        "op": ">=",
        "limit": 0.95,
        "rule": None,
        "pass": False,
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("kl: {max_increase: 5%}", "no kl to be relative to"),
        ("klx: {max: 1}", "unknown gate metric"),
        ("kl: {below: 1}", "unknown rule"),
        ("kl: {max: lots}", "not a number"),
        ("- kl", "expected a mapping"),
        ("kl: [1", "not valid YAML"),
    ],
)
def test_bad_gate_files_fail_in_one_line(tmp_path, text, message):
    path = tmp_path / "gates.yaml"
    path.write_text(text)
    with pytest.raises(LlmpressError, match=message):
        load_gate_file(path)
