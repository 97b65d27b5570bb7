"""Several processes through torch.distributed: `torchrun --nproc-per-node 2 -m compress
compress ...` on CPU (gloo) writes the artifact one process writes, bit for bit: each rank
calibrates on its shard of the samples, and every statistic is summed over the ranks in
float64 before it is used (compress/distributed.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from family_models import write_family
from safetensors.torch import load_file

from compress.errors import LlmpressError
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[1]

# AWQ's statistics, search losses and clipping Grams, then tune's gradients
# and errors (30 steps: its tuning is kept), on a dense model; GPTQ's Hessians and the
# expert routing counts on a Mixture-of-Experts one
CASES = {
    "llama3": [{"awq": {}}, {"tune": {"steps": 30}}],
    "qwen3_moe": [{"gptq": {}}],
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _artifact(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("family", CASES)
def test_two_ranks_write_the_one_process_artifact(tmp_path, family, wikitext):
    model = write_family(tmp_path / family, family, resolve("default").path)
    calib = tmp_path / "calib.txt"
    # fixed text (not the README, whose edits moved tune's outcome on these tiny models)
    calib.write_text((wikitext / "valid.txt").read_text(encoding="utf-8")[:40000])
    # 32 samples: four chunks of the walk's 8, two on each rank
    recipe = {"stages": CASES[family], "calib": {"source": str(calib), "samples": 32,
                                                  "length": 48}}  # fmt: skip
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    one = compress(str(model), parse_recipe(recipe), tmp_path / "one", log=lambda _: None)
    two = tmp_path / "two"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(_free_port()), "-m", "compress", "compress", str(model),
         "-o", str(two), "--recipe", str(tmp_path / "recipe.json"), "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("wrote ") == 1  # rank 0 alone writes and logs
    a, b = _artifact(one), _artifact(two)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    manifests = [json.loads((f / "manifest.json").read_text()) for f in (one, two)]
    assert manifests[1]["processes"] == 2
    tuned = [s for m in manifests for s in m["stages"] if s["stage"] == "tune"]
    if tuned:  # the same tuning, kept where it helped
        assert tuned[0]["output_mse"] == tuned[1]["output_mse"]
        # and the same blocks left as they were where it did not (whether tuning helps
        # a 2-block random model depends on the calibration text, not on the ranks)
        assert tuned[0]["not_improved"] == tuned[1]["not_improved"]
    assert manifests[0].get("experts") == manifests[1].get("experts")


def test_mixed_precision_refuses_several_processes(tmp_path, monkeypatch):
    """mixed precision's sensitivities see the whole model in one process: under torchrun
    it is refused in one line before any work."""
    monkeypatch.setattr("compress.distributed.world", lambda: 2)
    monkeypatch.setattr("compress.distributed.rank", lambda: 0)
    recipe = parse_recipe({"stages": [{"mixed": {}}, {"rtn": {}}]})
    with pytest.raises(LlmpressError, match=r"mixed run\(s\) on the whole model.*without torchrun"):
        compress("default", recipe, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out").exists()


def _torchrun(model: Path, out: Path, recipe: Path, ranks: int = 2):
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
         "--master-port", str(_free_port()), "-m", "compress", "compress", str(model),
         "-o", str(out), "--recipe", str(recipe), "--device", "cpu"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip


# the repair of a pruned model (every weight trains) and of a quantized one (its scales
# and zero points train, the integers fixed). In fp32: in bf16 (`auto` on a CPU with
# AMX-BF16 or AVX512-BF16) each rank rounds its own half batch's products, and the ranks
# agree with one process to bf16's precision only (seen 3e-4 relative in the losses), not
# the order of the sums this compares
REPAIR = {"tokens": 6 * 4 * 48, "batch": 4, "precision": "fp32"}
REPAIRS = {
    "pruned": [{"prune": {"mlp": 0.5}}, {"distill": REPAIR}],
    "quantized": [{"rtn": {}}, {"distill": REPAIR}],
}


# a Mixture-of-Experts student: an expert no token of one rank's half chose must still
# take part in that rank's gradient reductions. Every pair of family, repair and wrapper
# runs once (each picks its own code: the experts, what trains, the wrapper); the whole
# product took twice as long (8 runs of about 20 s)
CASES_REPAIR = [
    ("llama3", "pruned", "ddp"),
    ("llama3", "quantized", "fsdp"),
    ("qwen3_moe", "pruned", "fsdp"),
    ("qwen3_moe", "quantized", "ddp"),
]


@pytest.mark.parametrize("family, repair, parallel", CASES_REPAIR)
def test_two_ranks_repair_as_one_process(tmp_path, family, repair, parallel, wikitext):
    """prune's scores are summed over the ranks (the one process's, bit for bit) and the
    repair trains as DDP, or with teacher and student sharded by FSDP, each rank on half
    of every batch: the same steps, to float rounding (the gradients are summed in another
    order)."""
    model = write_family(tmp_path / family, family, resolve("default").path)
    calib = tmp_path / "calib.txt"
    calib.write_text((wikitext / "valid.txt").read_text(encoding="utf-8")[:40000])
    stages = [
        *REPAIRS[repair][:-1],
        {"distill": {**REPAIRS[repair][-1]["distill"], "parallel": parallel}},
    ]
    recipe = {"stages": stages, "calib": {"source": str(calib), "samples": 32, "length": 48}}
    (tmp_path / "recipe.json").write_text(json.dumps(recipe))
    one = compress(str(model), parse_recipe(recipe), tmp_path / "one", log=lambda _: None)
    run = _torchrun(model, tmp_path / "two", tmp_path / "recipe.json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("wrote ") == 1
    manifests = [json.loads((f / "manifest.json").read_text()) for f in (one, tmp_path / "two")]
    stages = [{s["stage"]: s for s in m["stages"]} for m in manifests]
    if repair == "pruned":
        assert stages[0]["prune"]["importance"] == stages[1]["prune"]["importance"]
    assert [s["distill"]["parallel"] for s in stages] == ["one process", parallel]
    losses = [[kl for _, kl in s["distill"]["loss_history"]] for s in stages]
    assert len(losses[0]) == len(losses[1]) == 6
    # experts: a token near a routing tie may pick another expert once the sums' order
    # differs, and Adam moves a rarely chosen expert by about lr whatever its gradient's
    # size: seen 5e-4 relative in the losses and 8e-5 in weights (lr 2e-4, 6 steps: an
    # expert left out of a rank's updates would be 1e-3 off); dense: 3e-7
    tol = 1e-3 if family.endswith("moe") else 1e-4
    assert losses[0] == pytest.approx(losses[1], rel=tol)
    a, b = _artifact(one), _artifact(tmp_path / "two")
    assert a.keys() == b.keys()
    for key in a:
        if a[key].is_floating_point():
            torch.testing.assert_close(b[key], a[key], rtol=10 * tol, atol=0.1 * tol, msg=key)
        else:  # integer codes: the repair trains scales around them, never the codes
            assert torch.equal(a[key], b[key]), key


def test_auto_shards_the_repair_where_ddp_would_not_fit(monkeypatch):
    """distill.parallel auto: DDP while its gradients, Adam's moments and the step's logits
    fit 80% of a rank's share of free memory, FSDP beyond; one process is never sharded."""
    from compress.distill import sharding

    trainable = [torch.zeros(1000, 1000)]  # 4 MB: DDP adds 12 MB beside the models
    cpu = torch.device("cpu")
    monkeypatch.setattr(sharding, "available_bytes", lambda: 100 * 2**20)
    assert sharding.choose("auto", trainable, 0, cpu) == "one process"
    monkeypatch.setattr("compress.distributed.world", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert sharding.choose("auto", trainable, 0, cpu) == "ddp"  # 12 MB of 50
    assert sharding.choose("auto", trainable, 30 * 2**20, cpu) == "fsdp"  # 42 MB of 50
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert sharding.choose("auto", trainable, 0, cpu) == "fsdp"  # 12 of 12.5 MB: above 80%
    assert sharding.choose("ddp", trainable, 10**12, cpu) == "ddp"  # asked: kept
