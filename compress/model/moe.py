"""The Mixture-of-Experts MLP as compression sees it: a router and one module per expert,
named as checkpoints store them.

transformers 5 holds experts stacked in one 3-D parameter per projection, which no
quantizer can address one expert at a time; this module keeps the checkpoint's own
per-expert linears (`experts.{e}.gate_proj` or mixtral's `experts.{e}.w1`), so every
stage, the writer and the artifact's names work expert by expert, and computes what the
family's sparse block computes (softmax over the router logits in fp32, top-k, optional
renormalization, weighted sum of the chosen experts).

Calibration: a block first runs once to count the tokens routed to each expert; an expert
that received fewer tokens than its input width (too few for a full-rank Hessian) is then
calibrated on every token as if selected, while the block's output still uses the real
routing. The counts and that choice go to the manifest.
"""

from __future__ import annotations

import torch
from torch import nn

from compress.errors import LlmpressError
from compress.model.spec import BlockSpec

ACT = {
    "silu": nn.functional.silu,
    "gelu_pytorch_tanh": lambda g: nn.functional.gelu(g, approximate="tanh"),
}


class Expert(nn.Module):
    def __init__(self, names: tuple[str, str, str], hidden: int, width: int, act: str):
        super().__init__()
        self.names, self.act = names, ACT[act]
        gate, up, down = names
        self.add_module(gate, nn.Linear(hidden, width, bias=False))
        self.add_module(up, nn.Linear(hidden, width, bias=False))
        self.add_module(down, nn.Linear(width, hidden, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up, down = (getattr(self, n) for n in self.names)
        return down(self.act(gate(x)) * up(x))


def route_scores(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    sigmoid: bool = False,
    choice_bias: torch.Tensor | None = None,
    scale: float = 1.0,
    groups: tuple[int, int] = (1, 1),
    group_score: str = "top2",
    sparsemixer: float | None = None,
    logit_choice: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k] fp32, experts [T, k]) from router logits [T, E] fp32, as the
    families route: scores are the softmax of the logits or each one's sigmoid (glm4_moe);
    the top k of score plus `choice_bias` are chosen (e_score_correction_bias steers the
    choice only), among the `groups[1]` of `groups[0]` expert groups whose best two score
    highest (or whose best one, `group_score` "max": DeepSeek-V2's); their scores,
    renormalized when asked, times `scale` are the weights. `sparsemixer`: PhiMoE's
    routing at inference, with that threshold (top_k 2; sparsemixer below).
    `logit_choice`: the logits plus `choice_bias` choose, and the chosen logits' sigmoids
    are the scores (Kolibri's; a bias steers otherwise than beside the sigmoids)."""
    if sparsemixer is not None:
        return sparsemixer_route(logits, sparsemixer)
    scores = torch.sigmoid(logits) if sigmoid or logit_choice else torch.softmax(logits, -1)
    choice = logits if logit_choice else scores
    choice = choice if choice_bias is None else choice + choice_bias
    n_group, top_groups = groups
    if n_group > 1:
        grouped = choice.view(choice.shape[0], n_group, -1)
        score = grouped.amax(-1) if group_score == "max" else grouped.topk(2, -1).values.sum(-1)
        best = score.topk(top_groups, -1).indices
        keep = torch.zeros_like(grouped[..., 0], dtype=torch.bool).scatter_(1, best, True)
        choice = choice.masked_fill(~keep.repeat_interleave(grouped.shape[-1], 1), -torch.inf)
    chosen = choice.topk(top_k, -1).indices
    weights = scores.gather(1, chosen)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return (weights * scale if scale != 1.0 else weights), chosen


def sparsemixer_route(logits: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PhiMoE's top-2 as transformers' sparsemixer computes it outside training: the arg
    max of the logits, weighted by the softmax over the experts whose logit is within a
    relative 2·eps of it (|s| floored at the max as the divisor), evaluated at it; then the
    same over the other experts for the second. The two weights do not sum to 1."""
    picks, weights = [], []
    scores = logits
    for _ in range(2):
        top, best = scores.max(-1, keepdim=True)
        factor = logits.abs().clamp(min=top)
        near = scores.masked_fill((top - logits) / factor > 2 * eps, -torch.inf)
        weights.append(torch.softmax(near, -1).gather(-1, best))
        picks.append(best)
        scores = scores.scatter(-1, best, -torch.inf)
    return torch.cat(weights, -1), torch.cat(picks, -1)


class MoeMLP(nn.Module):
    def __init__(self, spec: BlockSpec, adapter, hidden: int):
        super().__init__()
        moe = spec.mlp
        self.spec = moe
        # the router where the checkpoint keeps it (Hunyuan's inside a module: gate.wg)
        self.router_path = adapter.router.removeprefix(adapter.mlp + ".")
        owner, name = self._owner(self.router_path)
        owner.add_module(name, nn.Linear(hidden, moe.experts, bias=False))
        self.bias_path = None  # the choice bias, where the checkpoint keeps it (glm4_moe)
        # or beside the MLP, on the block (Kolibri's moe.router.expert_bias): install()
        # registers it there, and _block holds the block (unregistered)
        self.block_bias_path, self._block = None, []
        self.out_norm_path = adapter.moe_out_norm  # normed output (A.X-K1's), on the block
        if adapter.choice_bias and not adapter.choice_bias.startswith(adapter.mlp + "."):
            self.block_bias_path = adapter.choice_bias
        elif adapter.choice_bias:
            self.bias_path = adapter.choice_bias.removeprefix(adapter.mlp + ".")
            owner, name = self._owner(self.bias_path)  # e.g. on the router itself
            shape = (1, moe.experts) if adapter.choice_bias_2d else (moe.experts,)
            owner.register_buffer(name, torch.zeros(shape))
        self.experts = nn.ModuleList(
            Expert(adapter.expert_names, hidden, moe.intermediate, spec.activation)
            for _ in range(moe.experts)
        )
        self.shared_names = None  # a shared expert every token runs, gated by sigmoid
        if moe.shared:  # (qwen2_moe) or not (glm4_moe): under the checkpoint's names
            names = ("gate_proj", "up_proj", "down_proj")
            expert = adapter.shared_expert.rsplit(".", 1)[-1]
            gate = adapter.shared_gate.rsplit(".", 1)[-1] if adapter.shared_gate else None
            self.shared_names = (expert, gate)
            self.add_module(expert, Expert(names, hidden, moe.shared, spec.activation))
            if gate:
                self.add_module(gate, nn.Linear(hidden, 1, bias=False))
        self.counts: torch.Tensor | None = None  # tokens routed to each expert, when counting
        # when scoring experts for pruning: Σ over routed tokens of ‖weight · output‖²
        self.contributions: torch.Tensor | None = None
        self.all_tokens: set[int] = set()  # experts calibrated on every token
        # while a pass records linears' inputs (blocks.observe_inputs): only then do the
        # all_tokens experts run every token; the scale searches and the block's output
        # passes ran 64 experts on every token at DeepSeek-V2-Lite's widths, 10x the work
        self.observing = False

    def _owner(self, path: str) -> tuple[nn.Module, str]:
        """The module that holds `path`'s last name (made empty on the way), and that name."""
        owner = self
        *heads, name = path.split(".")
        for head in heads:
            if not hasattr(owner, head):
                owner.add_module(head, nn.Module())
            owner = getattr(owner, head)
        return owner, name

    def route(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k], expert indices [T, k]) for tokens [T, hidden]."""
        logits = self.get_submodule(self.router_path)(flat).float()
        bias = None
        if self.bias_path:
            bias = self.get_buffer(self.bias_path).float().reshape(-1)
        elif self.block_bias_path:
            bias = self._block[0].get_buffer(self.block_bias_path).float().reshape(-1)
        s = self.spec
        weights, chosen = route_scores(
            logits,
            s.top_k,
            s.renormalize,
            s.scoring == "sigmoid",
            bias,
            s.scale,
            s.groups,
            s.group_score,
            s.jitter if s.scoring == "sparsemixer" else None,
            s.scoring == "sigmoid_logits",
        )
        return weights.to(flat.dtype), chosen

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.route(flat)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.where(chosen == e)
            if self.counts is not None:
                self.counts[e] += rows.numel()
            if e in self.all_tokens and self.observing:  # calibrated as if every token chose it
                y = expert(flat)[rows]
            elif rows.numel() or torch.is_grad_enabled():
                # training: an expert no token chose still runs (on no rows), so its
                # gradients are zeros, not missing, and every rank of a sharded or
                # data-parallel repair reduces the same parameters
                y = expert(flat[rows])
            else:
                continue
            y = y * weights[rows, slot, None]
            if self.contributions is not None:
                self.contributions[e] += y.double().square().sum()
            out.index_add_(0, rows, y)
        if self.shared_names is not None:
            expert, gate = self.shared_names
            shared = getattr(self, expert)(flat)
            if self.spec.shared_scale != 1.0:  # cohere2_moe's average (a power of two)
                shared = shared * self.spec.shared_scale
            out = out + (
                shared if gate is None else torch.sigmoid(getattr(self, gate)(flat)) * shared
            )
        if self.out_norm_path:
            out = self._block[0].get_submodule(self.out_norm_path)(out)
        return out.reshape(x.shape)


def install(block: nn.Module, spec: BlockSpec, adapter, hidden: int) -> None:
    """Replace the transformers MoE module of a decoder layer (on any device, meta
    included) by a MoeMLP registered under the checkpoint's name (mixtral: block_sparse_moe)
    while the layer's forward still finds it as `mlp`."""
    device = next(block.parameters()).device
    moe = MoeMLP(spec, adapter, hidden).to(device)
    replaced = block._modules.pop("mlp", None)
    block.add_module(adapter.mlp, moe)
    if moe.out_norm_path:  # transformers' own norm, moved to where checkpoints keep it
        norm = getattr(replaced, moe.out_norm_path.rsplit(".", 1)[-1], None)
        if norm is None:
            raise LlmpressError(
                f"the MoE module of this {adapter.families[0]} model has no "
                f"{moe.out_norm_path}: the transformers version differs from the one "
                "llmpress supports; install the pinned one (scripts/setup)"
            )
        block.add_module(moe.out_norm_path, norm)
        moe._block[:] = [block]
    if moe.block_bias_path:  # on the block, beside the MLP
        *heads, name = moe.block_bias_path.split(".")
        owner = block
        for head in heads:
            if not hasattr(owner, head):
                owner.add_module(head, nn.Module())
            owner = getattr(owner, head)
        shape = (1, spec.mlp.experts) if adapter.choice_bias_2d else (spec.mlp.experts,)
        owner.register_buffer(name, torch.zeros(shape, device=device))
        moe._block[:] = [block]
    if adapter.mlp != "mlp":
        block.__dict__["mlp"] = moe  # the attribute the decoder layer's forward calls


def moe_modules(block: nn.Module) -> list[MoeMLP]:
    return [m for m in block.modules() if isinstance(m, MoeMLP)]


def expert_record(per_block: dict[int, dict], moe) -> dict:
    """The manifest's account of expert calibration: tokens each expert saw, per block,
    and which experts were calibrated on every token instead (fewer routed tokens than
    their input width)."""
    return {
        "experts": moe.experts,
        "top_k": moe.top_k,
        "rule": "an expert routed fewer calibration tokens than its input width is "
        "calibrated on every token as if selected; the block's output keeps the real routing",
        "blocks": {str(i): r for i, r in sorted(per_block.items())},
    }


def install_experts(model: nn.Module, adapter, spec: BlockSpec) -> None:
    """Give every Mixture-of-Experts decoder layer of a transformers model (meta or real) a
    MoeMLP, named as the checkpoint stores its experts; a layer the model keeps dense
    (spec.mlp.dense_layers) keeps transformers' own MLP, whose linears are llama's."""
    hidden = model.config.hidden_size
    for i in range(model.config.num_hidden_layers):
        if i not in spec.mlp.dense_layers:
            install(model.get_submodule(adapter.block_prefix(i)), spec, adapter, hidden)
