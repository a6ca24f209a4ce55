"""Several processes training one adapter: `torchrun --nproc-per-node N -m onjob.cli train`.

Data parallel, DDP's contract: every rank holds the same weights and optimizer state,
computes its share of each step's groups, and the step's gradients are summed across
ranks before the (identical) clip and optimizer step, so the weights stay equal and a step
is the one a single process takes on the same groups, up to the order of float sums.

The all-reduce is issued by hand, once per step after the step's backward passes, rather
than by wrapping the model in `DistributedDataParallel`, whose hooks all-reduce inside
every backward: here a step's groups split into a different number of packed forwards on
each rank (members chunked by length), and a rank may hold no group of a step at all, so
per-backward collectives would not pair up across ranks. One flat buffer per step is also
what DDP's bucketing amounts to for a LoRA's few MiB of gradients.

A single process (no `WORLD_SIZE` in the environment, or 1) gets `Ranks.one()`, whose
methods are no-ops: the loop reads the same either way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def one(cls) -> Ranks:
        return cls()

    @classmethod
    def from_env(cls, device: torch.device) -> Ranks:
        """The process group torchrun describes (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
        `MASTER_ADDR`/`MASTER_PORT`), started here: gloo on CPU, nccl on CUDA."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls.one()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        return cls(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))

    @property
    def main(self) -> bool:
        """The rank that speaks and writes the checkpoint."""
        return self.rank == 0

    @property
    def many(self) -> bool:
        return self.world > 1

    def share(self, items: list[T]) -> list[T]:
        """This rank's items of a step: every `world`-th, from its rank."""
        return items[self.rank :: self.world]

    def same_start(self, params: list[torch.Tensor]) -> None:
        """Rank 0's initial weights on every rank (a seeded LoRA init is already equal;
        this makes it so whatever the init does)."""
        if not self.many:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0)

    def sum_gradients(self, params: list[torch.Tensor]) -> None:
        """Every rank's accumulated gradients summed, in one all-reduce; a parameter this
        rank did not reach (no group this step) contributes zeros."""
        if not self.many:
            return
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for p, g in zip(params, grads, strict=True):
            n = g.numel()
            p.grad = flat[offset : offset + n].view_as(p).to(p.dtype)
            offset += n

    def sum(self, values: Mapping[str, float]) -> Mapping[str, float]:
        """Each figure summed over ranks (a step's loss, clipped tokens, ...)."""
        if not self.many:
            return values
        import torch.distributed as dist

        keys = sorted(values)
        t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        return dict(zip(keys, t.tolist(), strict=True))

    def gather(self, value: T) -> list[T]:
        """Every rank's `value` (small picklable objects: ids, skip reasons), in rank order."""
        if not self.many:
            return [value]
        import torch.distributed as dist

        out: list = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def largest_difference(self, params: list[torch.Tensor]) -> float:
        """The largest |rank 0's weight - this rank's| over every rank: 0.0 when the ranks
        hold the same adapter, as data parallelism requires (recorded in the manifest)."""
        if not self.many:
            return 0.0
        import torch.distributed as dist

        with torch.no_grad():
            mine = torch.cat([p.detach().reshape(-1).float() for p in params])
            first = mine.clone()
            dist.broadcast(first, src=0)
            gap = (mine - first).abs().max().reshape(1).double()
            dist.all_reduce(gap, op=dist.ReduceOp.MAX)
        return gap.item()

    def close(self) -> None:
        if self.many:
            import torch.distributed as dist

            dist.barrier()
            dist.destroy_process_group()
