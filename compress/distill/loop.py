"""The repair loop: the original model teaches the pruned one, resumably.

Loss: T² · KL(teacher_T ‖ student_T) over the vocabulary at every position (Hinton's
temperature scaling keeps gradients comparable across T), plus optionally a normalized
MSE between matched layers' outputs (student layer j ↔ teacher layer layer_map[j], on the
kept hidden channels). AdamW, linear warm-up then cosine decay.

Every step's batch is a function of the step number and the seed alone, and a checkpoint
holds the student, the optimizer and the step, so a run killed at any point and resumed
from its last checkpoint computes exactly what the uninterrupted run would have.

Under torchrun each rank takes every world-th sequence of the step's batch, its loss
weighted by its share, and the gradients are averaged, so every rank takes the one
process's step (to float rounding: the sums run in another order). The student trains as
torch's DistributedDataParallel, or, where what DDP adds does not fit a process's memory
(`parallel`), with teacher and student sharded by FSDP (compress/distill/sharding.py).
Rank 0 logs and checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import resource
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from compress import distributed
from compress.distill import precision, sharding
from compress.errors import LlmpressError, first_line
from compress.model.adapters import LLAMA, Adapter


@dataclass(frozen=True)
class DistillSettings:
    steps: int
    batch: int
    lr: float
    warmup: float
    min_lr_ratio: float
    weight_decay: float
    temperature: float
    hidden_weight: float
    checkpoint_every: int
    max_seconds: float | None
    train_embeddings: bool
    seed: int
    parallel: str = "auto"  # under torchrun: ddp, fsdp, or auto (fsdp where ddp does not fit)
    precision: str = "fp32"  # the matmuls' precision, resolved: fp32 or bf16 (precision.py)
    train_dense: bool = False  # a quantized model's norm weights and biases train too


def lr_factor(step: int, s: DistillSettings) -> float:
    warm = max(1, round(s.warmup * s.steps))
    if step < warm:
        return (step + 1) / warm
    progress = (step - warm) / max(1, s.steps - warm)
    return s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_indices(step: int, batch: int, n: int, seed: int) -> torch.Tensor:
    """Sample indices of `step`: epochs are seeded permutations, walked in order."""
    idx = []
    for k in range(step * batch, (step + 1) * batch):
        epoch, pos = divmod(k, n)
        gen = torch.Generator().manual_seed(seed * 100003 + epoch)
        perm = torch.randperm(n, generator=gen, device="cpu")
        idx.append(int(perm[pos]))
    return torch.tensor(idx, device="cpu")  # indexes the samples, kept in host memory


def kd_loss(student_logits, teacher_logits, temperature: float) -> torch.Tensor:
    t = temperature
    s = torch.log_softmax(student_logits.float() / t, -1)
    p = torch.log_softmax(teacher_logits.float() / t, -1)
    return (p.exp() * (p - s)).sum(-1).mean() * t * t


class _LayerOutputs:
    """Collects each decoder layer's output during a forward pass."""

    def __init__(self, layers):
        self.out: list[torch.Tensor] = []
        self.handles = [layer.register_forward_hook(self._hook) for layer in layers]

    def _hook(self, _m, _args, out):
        self.out.append(out[0] if isinstance(out, tuple) else out)

    def take(self) -> list[torch.Tensor]:
        out, self.out = self.out, []
        return out


def hidden_loss(student_out, teacher_out, layer_map, hidden_index) -> torch.Tensor:
    total = 0.0
    for j, s in enumerate(student_out):
        t = teacher_out[layer_map[j]]
        if hidden_index is not None:
            t = t.index_select(-1, hidden_index.to(t.device))
        total = total + (s - t).square().mean() / t.square().mean().clamp_min(1e-8)
    return total / len(student_out)


def fingerprint(
    settings: DistillSettings,
    config: dict,
    data: torch.Tensor,
    student,
    param_groups: list[dict] | None = None,
) -> str:
    """Names a run by everything that determines its result (settings, model shape, data,
    the student's starting weights, each optimizer group's lr): a checkpoint resumes only
    the run that wrote it."""
    lrs = [g["lr"] for g in param_groups or []]
    h = hashlib.sha256(json.dumps([asdict(settings), config, lrs], sort_keys=True).encode())
    h.update(data.numpy().tobytes())
    for t in student.state_dict().values():
        h.update(t.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _adamw(params, s: DistillSettings) -> torch.optim.Optimizer:
    """AdamW, fused where torch has the kernel: one pass over all parameters instead of a
    loop per tensor (0.08 s instead of 0.39 s per step for 66M parameters on 2 cores)."""
    kw = {"lr": s.lr, "betas": (0.9, 0.95), "weight_decay": s.weight_decay}
    try:
        return torch.optim.AdamW(params, fused=True, **kw)
    except (RuntimeError, TypeError):  # older torch: no fused kernel for this device
        return torch.optim.AdamW(params, **kw)


def _save(path: Path, payload: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def distill(
    student,
    teacher,
    data: torch.Tensor,
    s: DistillSettings,
    *,
    work_dir: Path,
    resume: bool,
    run_id: str,
    adapter: Adapter = LLAMA,
    layer_map: list[int] | None = None,
    hidden_index: torch.Tensor | None = None,
    param_groups: list[dict] | None = None,
    log=print,
) -> dict:
    """Train `student` toward `teacher` on token samples `data` [n, length]; returns a record.
    `param_groups` (optimizer groups, each with its lr) trains only those parameters."""
    if s.batch < distributed.world():
        raise LlmpressError(
            f"distill.batch {s.batch} is smaller than the {distributed.world()} processes: "
            f"raise it to at least {distributed.world()}, or start fewer"
        )
    torch.manual_seed(s.seed)
    teacher.eval().requires_grad_(False)
    student.train()
    if param_groups is None:
        params = groups = _trainable(student, adapter, s.train_embeddings)
    else:
        student.requires_grad_(False)
        params = [p.requires_grad_() for g in param_groups for p in g["params"]]
        groups = param_groups
    device = next(student.parameters()).device
    rows = -(-s.batch // distributed.world())  # two models' logits and softmaxes, fp32:
    logits = 16 * rows * data.shape[1] * teacher.config.vocab_size  # the step's largest
    mode = sharding.choose(s.parallel, params, logits, device)
    t_run, s_run = teacher, student
    if mode == "fsdp":
        t_run, s_run, twin_of = sharding.shard_pair(teacher, student, adapter.blocks)
        params = [twin_of(p) for p in params]
        groups = (
            params
            if param_groups is None
            else [{**g, "params": [twin_of(p) for p in g["params"]]} for g in param_groups]
        )
    if mode != "one process":
        log(f"distill: {mode} over {distributed.world()} processes")
    opt = _adamw(groups, s)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, s))
    ckpt_path = Path(work_dir) / f"distill-{run_id}.pt"
    sharded = mode == "fsdp"
    start, history = _resume(ckpt_path, resume, s_run, opt, sched, s.steps, log, sharded)
    started = time.perf_counter()
    with _layer_outputs(s_run, t_run, adapter, s.hidden_weight > 0) as grab:
        step, stopped, done_tokens = _train(
            _data_parallel(s_run) if mode == "ddp" else s_run, t_run, data, s, opt, sched,
            params, history, start, grab, layer_map, hidden_index,
            lambda step: _checkpoint(ckpt_path, run_id, step, s_run, opt, sched, history, sharded),
        )  # fmt: skip
    training_rss = _resident_mb()  # before the models are whole again
    if sharded:  # the trained weights (and the teacher's) whole again, on every rank
        sharding.gather(s_run, student)
        sharding.gather(t_run, teacher)
        del s_run, t_run, opt
    student.eval().requires_grad_(False)
    seconds = time.perf_counter() - started
    return {
        "steps": step,
        "planned_steps": s.steps,
        "resumed_from": start,
        "stopped_on": stopped,
        "parallel": mode,
        "precision": s.precision,
        "tokens": step * s.batch * data.shape[1],
        "seconds_this_run": round(seconds, 1),
        "tokens_per_second": round(done_tokens / seconds, 1) if seconds else None,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "training_rss_mb": training_rss,
        "loss_history": history,
    }


def _resident_mb() -> int | None:
    """This process's resident memory now (Linux), in MB."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return round(pages * os.sysconf("SC_PAGE_SIZE") / 2**20)


def _data_parallel(student):
    """The student as DDP. Unused parameters are still looked for, as a guard: an MoE
    expert no token of a rank's rows chose runs on no rows (moe.py), so it has zeros."""
    from torch.nn.parallel import DistributedDataParallel

    device = next(student.parameters()).device
    return DistributedDataParallel(
        student,
        device_ids=[device] if device.type == "cuda" else None,
        find_unused_parameters=True,
    )


def _trainable(student, adapter: Adapter, train_embeddings: bool) -> list:
    """Every parameter trains, except the embedding and lm_head unless asked."""
    frozen = () if train_embeddings else (adapter.embed + ".", adapter.head_module + ".")
    for name, p in student.named_parameters():
        p.requires_grad_(not name.startswith(frozen))
    return [p for p in student.parameters() if p.requires_grad]


def _checkpoint(path: Path, run_id, step, student, opt, sched, history, sharded: bool) -> None:
    """Rank 0 saves the run's state; sharded, every rank gathers it first (whole tensors,
    the optimizer's by parameter name)."""
    if not sharded and not distributed.is_writer():
        return
    if sharded:
        model_state, opt_state = sharding.full_state(student, opt)
    else:
        model_state, opt_state = student.state_dict(), opt.state_dict()
    if distributed.is_writer():
        _save(path, {"run_id": run_id, "step": step, "sharded": sharded,
                     "student": model_state, "optimizer": opt_state,
                     "scheduler": sched.state_dict(), "history": history})  # fmt: skip


def _resume(ckpt_path: Path, resume: bool, student, opt, sched, steps: int, log, sharded: bool):
    """(first step, loss history): from this run's last checkpoint when resuming."""
    if resume and ckpt_path.is_file():
        state = _load_checkpoint(ckpt_path)
        if state.get("run_id") != ckpt_path.stem.removeprefix("distill-"):
            raise LlmpressError(
                f"{ckpt_path} is not a checkpoint of this run: delete it, or run without --resume"
            )
        if state.get("sharded", False) != sharded:
            was = "an fsdp" if state.get("sharded") else "an unsharded (ddp or one-process)"
            fix = "fsdp under torchrun" if state.get("sharded") else "ddp"
            raise LlmpressError(
                f"{ckpt_path} holds {was} repair's state, and this one runs "
                f"{'sharded' if sharded else 'unsharded'}: resume with distill.parallel: {fix}, "
                "or delete it"
            )
        if sharded:
            sharding.load_full_state(student, opt, state["student"], state["optimizer"])
        else:
            student.load_state_dict(state["student"])
            opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        log(f"distill: resumed from step {state['step']} of {steps} ({ckpt_path})")
        return state["step"], state["history"]
    if resume:
        log(f"distill: no checkpoint of this run in {ckpt_path.parent}; starting from step 0")
    return 0, []


def _load_checkpoint(path: Path) -> dict:
    """A checkpoint holds tensors and plain numbers only: load it as data
    (weights_only), never as a pickle that could run code planted beside the output."""
    try:
        state = torch.load(path, weights_only=True)
    except Exception as e:
        first = first_line(e, 120)
        raise LlmpressError(
            f"{path} is not a readable llmpress checkpoint ({type(e).__name__}: {first}): "
            "delete it, or run without --resume"
        ) from None
    if not isinstance(state, dict):
        raise LlmpressError(f"{path} is not an llmpress checkpoint: delete it")
    return state


@contextmanager
def _layer_outputs(student, teacher, adapter: Adapter, enabled: bool):
    """Hooks that collect both models' layer outputs (for the hidden-state loss), removed
    however training ends (an interrupt, an error, the last step)."""
    if not enabled:
        yield None
        return
    grabs = (
        _LayerOutputs(student.get_submodule(adapter.blocks)),
        _LayerOutputs(teacher.get_submodule(adapter.blocks)),
    )
    try:
        yield grabs
    finally:
        for h in grabs[0].handles + grabs[1].handles:
            h.remove()


def _train(student, teacher, data, s, opt, sched, params, history, start, grab, layer_map,
           hidden_index, checkpoint) -> tuple[int, str, int]:  # fmt: skip
    """The steps from `start`: (last step, why it stopped, tokens trained on)."""
    started, done_tokens = time.perf_counter(), 0
    device = next(student.parameters()).device  # the samples stay in host memory
    rank, world, writer = distributed.rank(), distributed.world(), distributed.is_writer()
    bar = tqdm(range(start, s.steps), desc="distill", unit="step", initial=start, total=s.steps,
               disable=not writer)  # fmt: skip
    for step in bar:
        if _out_of_time(s, started):
            return step, "time", done_tokens
        mine = batch_indices(step, s.batch, data.shape[0], s.seed)[rank::world]
        ids = data[mine].to(device)
        with torch.no_grad(), precision.autocast(s.precision, device):
            t_logits = teacher(input_ids=ids, use_cache=False).logits
        t_hidden = grab[1].take() if grab else None
        with precision.autocast(s.precision, device):
            s_logits = student(input_ids=ids, use_cache=False).logits
        loss = kd_loss(s_logits, t_logits, s.temperature)
        share = len(mine) / s.batch  # of the batch: DDP's mean over ranks makes the sum
        (kd,) = distributed.sum_floats(loss.item() * share)
        if grab:
            loss = loss + s.hidden_weight * hidden_loss(
                grab[0].take(), t_hidden, layer_map, hidden_index
            )
        opt.zero_grad(set_to_none=True)
        (loss * (share * world) if world > 1 else loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        done_tokens += s.batch * ids.shape[1]
        history.append([step, round(kd, 5)])
        rate = done_tokens / (time.perf_counter() - started)
        bar.set_postfix(kl=f"{kd:.4f}", tok_s=f"{rate:.0f}", lr=f"{sched.get_last_lr()[0]:.2e}")
        if (step + 1) % s.checkpoint_every == 0 and step + 1 < s.steps:
            checkpoint(step + 1)  # every rank: a sharded state is gathered first
    return s.steps, "tokens", done_tokens


def _out_of_time(s: DistillSettings, started: float) -> bool:
    """Whether the time budget ran out, on any rank: the ranks stop at the same step."""
    if s.max_seconds is None:
        return False
    late = time.perf_counter() - started > s.max_seconds
    return distributed.sum_floats(float(late))[0] > 0
