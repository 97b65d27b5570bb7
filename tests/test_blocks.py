"""Block-by-block execution must compute exactly what the whole model computes."""

import torch

from compress.model.blocks import BlockStore, run_block


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
