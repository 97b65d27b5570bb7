"""Where compression computes: `--device auto|cpu|cuda[:N]`, and where the calibration
activations live.

A block, its statistics and its searches live on the compute device; what the artifact
writer reads (integers, scales, changed norms) comes back to the CPU as each block ends.
The activations carried from block to block are the one thing that grows with the
calibration set: they stay on the device when they fit beside a block's working set, and
otherwise stay in host memory and go to the device a chunk at a time.
"""

from __future__ import annotations

import torch

from compress.errors import LlmpressError

DEVICES = "auto, cpu, cuda or cuda:N"


def resolve_device(name: str | torch.device | None) -> torch.device:
    """The device `--device NAME` means; refuses in one line what this machine lacks."""
    if isinstance(name, torch.device):
        return name
    name = (name or "auto").strip().lower()
    if name == "auto":
        return torch.device("cuda", torch.cuda.current_device()) if _cuda_count() else _CPU
    if name == "cpu":
        return _CPU
    kind, _, index = name.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise LlmpressError(f"--device {name}: not a device; use {DEVICES}")
    count = _cuda_count()
    if not count:
        raise LlmpressError(
            f"--device {name}: this machine has no CUDA device torch can use; "
            "use --device cpu (or auto)"
        )
    number = int(index) if index else torch.cuda.current_device()
    if number >= count:
        raise LlmpressError(
            f"--device {name}: this machine has {count} CUDA device(s), cuda:0 to "
            f"cuda:{count - 1}; name one of them"
        )
    return torch.device("cuda", number)


def describe(device: torch.device) -> str:
    """The device as the manifest records it: its name, and the card's model on CUDA."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


def free_bytes(device: torch.device) -> int | None:
    """Memory the device can still give (None: host memory, which the OS manages)."""
    if device.type != "cuda":
        return None
    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def activation_home(device: torch.device, activation_bytes: int, block_bytes: int):
    """Where the calibration activations live: on `device` when they fit beside what a
    block needs there (its fp32 weights, a Hessian per input and the searches' temporaries,
    taken as four times the weights), else on the CPU, moved to the device in chunks."""
    free = free_bytes(device)
    if free is None or activation_bytes + 4 * block_bytes <= free:
        return device
    return _CPU


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


_CPU = torch.device("cpu")
