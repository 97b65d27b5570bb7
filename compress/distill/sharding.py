"""Teacher and student as FSDP shards: a repair larger than one process's memory.

Under torchrun, DDP keeps the whole teacher, the whole student, its gradients and Adam's
two moments in every process. FSDP (torch's `fully_shard`) keeps each rank's 1/N of every
parameter and gathers one block's weights at a time for its forward and backward, so the
gradients and Adam's moments are 1/N too.

The pipeline's models stay what they are: training runs on a copy whose parameters are
this rank's shards (buffers, such as a quantized student's integer codes, shared with the
original, not copied). The originals' parameters are emptied meanwhile and get the trained
values back, whole on every rank, at the end, as the later stages and the writer expect.
"""

from __future__ import annotations

import copy
import os

import torch

from compress import distributed
from compress.calib_data.cost import available_bytes
from compress.device import free_bytes

MODES = ("auto", "ddp", "fsdp")
HEADROOM = 0.8  # of the free memory a process may plan to fill


def choose(asked: str, trainable: list, activation_bytes: int, device: torch.device) -> str:
    """The repair's mode: one process, ddp or fsdp. auto: FSDP when what DDP adds beside
    the loaded models (the gradients and Adam's two moments of `trainable`, and the step's
    activations) is more than this process's share of the free memory."""
    if distributed.world() == 1:
        return "one process"
    mode = asked
    if asked == "auto":
        need = 3 * sum(p.numel() * p.element_size() for p in trainable) + activation_bytes
        free = free_bytes(device)
        if free is None:
            free = available_bytes()
            free = None if free is None else free // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        mode = "fsdp" if free is not None and need > HEADROOM * free else "ddp"
    return mode


def shard(model: torch.nn.Module, blocks: str) -> torch.nn.Module:
    """A copy of `model` whose parameters are this rank's FSDP shards (each block one unit,
    the rest the root's), its buffers `model`'s own."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    device = next(model.parameters()).device
    whole = dict(model.named_parameters())
    memo = {  # deepcopy maps each parameter to a meta one and each buffer to itself
        id(p): torch.nn.Parameter(torch.empty_like(p, device="meta"), p.requires_grad)
        for p in model.parameters()
    }
    memo.update({id(b): b for b in model.buffers()})
    twin = copy.deepcopy(model, memo)
    buffers = [(m, n, b) for m in twin.modules() for n, b in m._buffers.items() if b is not None]
    mesh = init_device_mesh(device.type, (distributed.world(),))
    for block in twin.get_submodule(blocks):
        fully_shard(block, mesh=mesh)
    fully_shard(twin, mesh=mesh)
    twin.to_empty(device=device)  # the shards' memory; it also blanks the shared buffers
    for module, name, buffer in buffers:
        module._buffers[name] = buffer
    set_model_state_dict(twin, whole, options=StateDictOptions(full_state_dict=True, strict=False))
    return twin


def shard_pair(teacher: torch.nn.Module, student: torch.nn.Module, blocks: str):
    """Both models' twins, each model emptied once its twin holds its values (a parameter
    the two share only after both twins do), and the map from a student parameter to its
    twin's (for the optimizer's groups)."""
    names = {id(p): n for n, p in student.named_parameters()}
    t_run = shard(teacher, blocks)
    release(teacher, keep=student.parameters())
    s_run = shard(student, blocks)
    release(student)
    twin = dict(s_run.named_parameters())
    return t_run, s_run, lambda p: twin[names[id(p)]]


def release(model: torch.nn.Module, keep=()) -> None:
    """`model`'s parameters emptied (their values live in a twin's shards until `gather`),
    but those of `keep`: a parameter the other model shares must wait for its twin."""
    kept = {id(p) for p in keep}
    for p in model.parameters():
        if id(p) not in kept:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)


def gather(twin: torch.nn.Module, model: torch.nn.Module) -> None:
    """`model`'s parameters set to `twin`'s, whole, on every rank."""
    whole = full_state(twin)
    for name, p in model.named_parameters():
        p.data = whole[name].to(p.device)


def full_state(twin: torch.nn.Module, opt=None):
    """The whole state dict (and the optimizer's, by parameter name), on every rank: every
    rank must call it."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    state = get_model_state_dict(twin, options=options)
    if opt is None:
        return state
    return state, get_optimizer_state_dict(twin, opt, options=options)


def load_full_state(twin: torch.nn.Module, opt, state: dict, opt_state: dict) -> None:
    """What `full_state` returned, back into the shards and the optimizer."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(twin, state, options=options)
    set_optimizer_state_dict(twin, opt, opt_state, options=options)
