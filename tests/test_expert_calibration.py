"""Experts routed fewer calibration tokens than their input width are calibrated on every
token (model/moe.py), but only while a pass records inputs: every other forward of the
block (a scale search's, the output passed to the next block) runs the real routing."""

from __future__ import annotations

import torch
from family_models import write_family

from compress.model.blocks import BlockStore, observe_inputs, route_calibration, run_block
from compress.model.loading import resolve
from compress.model.moe import moe_modules


def test_every_token_reaches_an_expert_only_while_its_inputs_are_recorded(tmp_path):
    model = write_family(tmp_path / "moe", "qwen2_moe", resolve("default").path)
    store = BlockStore(resolve(str(model)))
    ids = torch.randint(0, 1000, (2, 24), generator=torch.Generator().manual_seed(0))
    hidden, rope = store.embed(ids), store.position_embeddings(ids.shape[1])
    block = store.block(0)
    record = route_calibration(block, hidden, rope)
    (moe,) = moe_modules(block)
    assert moe.all_tokens == {0, 1, 2, 3}, record  # 48 tokens: each expert sees < 128
    gate = next(n for n, _ in block.named_modules() if n.endswith("experts.0.gate_proj"))
    rows = []
    hook = block.get_submodule(gate).register_forward_pre_hook(
        lambda _m, args: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])
    )
    try:
        plain = run_block(block, hidden, rope)
        routed = sum(rows)
        assert routed == record["routed_tokens"][0] < ids.numel()
        rows.clear()
        seen = []
        outputs = torch.empty_like(hidden)
        observe_inputs(block, hidden, rope, [gate], lambda _n, x: seen.append(x), outputs)
        assert sum(rows) == ids.numel() == sum(x.reshape(-1, x.shape[-1]).shape[0] for x in seen)
    finally:
        hook.remove()
    assert not moe.observing
    torch.testing.assert_close(outputs, plain, rtol=1e-5, atol=1e-5)
