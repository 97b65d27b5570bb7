"""Block-by-block execution must compute exactly what the whole model computes."""

import torch

from compress.allocator import THRESHOLD
from compress.model.blocks import CHUNK, BlockStore, chunk_samples, observe_inputs, run_block


def test_blockwise_forward_matches_the_model(default_ckpt, base_model, tokenizer, wikitext):
    text = (wikitext / "valid.txt").read_text()[:6000]
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :192].reshape(3, 64)
    store = BlockStore(default_ckpt)
    hidden = store.embed(ids)
    rope = store.position_embeddings(ids.shape[1])
    for i in range(store.num_layers):
        hidden = run_block(store.block(i), hidden, rope)
        store.release(i)
        # released blocks hold no memory
        assert store.skeleton.model.layers[i].mlp.up_proj.weight.is_meta
    with torch.no_grad():
        expected = base_model(ids, output_hidden_states=True).hidden_states[-1]
        ours = base_model.model.norm(hidden)
    assert torch.allclose(ours, expected, atol=1e-4, rtol=1e-4)


def test_an_observing_pass_without_outputs_stops_at_its_last_input(default_ckpt):
    """Observing a block's linears' inputs with no outputs wanted stops each chunk's
    forward once every named input is seen (down_proj's own product never runs), and
    sees exactly the inputs a whole pass that keeps the outputs sees."""
    store = BlockStore(default_ckpt)
    ids = torch.randint(0, 1000, (CHUNK + 3, 32), generator=torch.Generator().manual_seed(0))
    hidden, rope = store.embed(ids), store.position_embeddings(ids.shape[1])
    block = store.block(2)
    names = ["self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"]
    runs = []
    handle = block.mlp.down_proj.register_forward_hook(lambda *_: runs.append(1))
    try:
        seen_whole: dict[str, list] = {}
        outputs = torch.empty_like(hidden)
        observe_inputs(
            block,
            hidden,
            rope,
            names,
            lambda n, x: seen_whole.setdefault(n, []).append(x.clone()),
            outputs,
        )
        assert len(runs) == 2  # two chunks, each run to the end
        torch.testing.assert_close(outputs, run_block(block, hidden, rope), rtol=0, atol=0)
        runs.clear()
        seen: dict[str, list] = {}
        observe_inputs(
            block, hidden, rope, names, lambda n, x: seen.setdefault(n, []).append(x.clone())
        )
        assert runs == []  # stopped at down_proj's input, both chunks
    finally:
        handle.remove()
    assert seen.keys() == seen_whole.keys() == set(names)
    for name in names:
        assert len(seen[name]) == 2
        for a, b in zip(seen[name], seen_whole[name], strict=True):
            assert torch.equal(a, b)


def test_a_chunk_keeps_its_widest_activation_under_the_mmap_threshold(default_ckpt):
    """On the CPU a block's forward takes as many samples as keep its widest activation
    (the default model's 1536-wide MLP) under the allocator's mmap threshold, one at
    least and CHUNK at most; a device takes CHUNK."""
    store = BlockStore(default_ckpt)
    assert [store.position_embeddings(n).chunk for n in (32, 128, 512, 4096)] == [8, 5, 1, 1]
    for length in (128, 512):
        chunk = store.position_embeddings(length).chunk
        assert 4 * chunk * length * 1536 < THRESHOLD <= 4 * (chunk + 1) * length * 1536
    assert chunk_samples(512, 1536, "meta") == chunk_samples(512, 1536, "cuda") == CHUNK
