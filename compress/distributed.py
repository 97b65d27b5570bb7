"""Several processes through torch.distributed: `torchrun --nproc-per-node N -m compress
compress ...` (gloo on CPU, nccl on GPUs).

Each rank holds a shard of the calibration samples, whole chunks of the block walk's
samples (`Positions.chunk`) dealt round-robin, so every sample goes through the very same batched
forward it would in one process. What a stage accumulates is summed (or maxed) over the
ranks before it is used: Hessians, activation norms, AWQ's candidate losses and clipping
Grams, tune's gradients and errors, expert routing counts. Sums are kept in float64,
where adding a few fp32 partial sums is exact in any order, so N ranks make the artifact
one process makes. Every rank then runs the same transforms on the same statistics;
rank 0 alone writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from compress.errors import LlmpressError


def world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if world() > 1 else 0


def is_writer() -> bool:
    """Rank 0 writes the artifact and logs; every rank computes."""
    return rank() == 0


def launched() -> bool:
    """Whether torchrun started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def start(device: torch.device) -> None:
    """Join the process group torchrun describes (gloo for CPU, nccl for CUDA)."""
    if not launched() or world() > 1:
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)


def stop() -> None:
    """Leave the process group together, once rank 0 has written the artifact: seen once on
    a loaded host, a rank that tore its group down while rank 0 was still writing aborted
    (`terminate called without an active exception`, an FSDP repair; not reproduced in 12
    runs since, so the barrier is a likely fix, not a proven one)."""
    if world() > 1:
        dist.barrier()
        dist.destroy_process_group()


def local_device(device: torch.device) -> torch.device:
    """Under torchrun each rank takes the GPU of its LOCAL_RANK when the device is CUDA."""
    if device.type != "cuda" or not launched():
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if local >= torch.cuda.device_count():
        raise LlmpressError(
            f"rank {local} has no GPU of its own ({torch.cuda.device_count()} here): "
            "start at most that many processes per node"
        )
    return torch.device("cuda", local)


def all_sum(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over the ranks, in place (no-op in one process)."""
    return _reduce(t, "SUM")


def all_max(t: torch.Tensor) -> torch.Tensor:
    return _reduce(t, "MAX")


def _reduce(t: torch.Tensor, op: str) -> torch.Tensor:
    if world() == 1:
        return t
    op = getattr(dist.ReduceOp, op)
    if dist.get_backend() == "nccl" and t.device.type == "cpu":  # nccl reduces GPU memory
        moved = t.to(torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(moved, op=op)
        return t.copy_(moved)
    dist.all_reduce(t, op=op)
    return t


def mean_squared_error(outputs, targets) -> float:
    """Mean of (output - target)² over every rank's chunks (sequences of tensors, zipped):
    each chunk's fp32 sum added in float64, so the figure does not depend on how the
    chunks are spread over ranks."""
    total, count = 0.0, 0
    for o, t in zip(outputs, targets, strict=True):
        total += float((o - t).pow(2).sum())
        count += o.numel()
    total, count = sum_floats(total, count)
    return total / count


def sum_floats(*values: float, device="cpu") -> list[float]:
    """Python numbers summed over the ranks (float64)."""
    if world() == 1:
        return list(values)
    return all_sum(torch.tensor(values, dtype=torch.float64, device=device)).tolist()


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def first_then_rest(fn):
    """`fn()` on rank 0 first, then on the others: what fills a cache (a GGUF's conversion,
    self-generated calibration text) is made once, and the rest read it."""
    if is_writer():
        out = fn()
        barrier()
        return out
    barrier()
    return fn()


@dataclass(frozen=True)
class Shard:
    """The calibration samples this rank holds: their global indices, ascending, of
    `total`. Chunks of `chunk` samples go round-robin, so each rank's chunks are the
    single process's chunks."""

    indices: tuple[int, ...]
    total: int

    @staticmethod
    def of(total: int, chunk: int) -> Shard:
        r, n = rank(), world()
        return Shard(tuple(i for i in range(total) if (i // chunk) % n == r), total)

    def below(self, count: int) -> int:
        """How many of this rank's rows have a global index below `count` (they come
        first, indices being ascending)."""
        return sum(1 for i in self.indices if i < count)

    def rows(self, wanted) -> list[int]:
        """This rank's row of each global index in `wanted` that it holds."""
        where = {g: k for k, g in enumerate(self.indices)}
        return [where[g] for g in wanted if g in where]
