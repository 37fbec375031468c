"""A minimal data-parallel training script for stock ``torchrun`` (CPU, gloo): the quickstart's workload.

torchrun starts one copy per worker with ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` set from
the round the k8s rendezvous formed. Each worker trains the same small linear model on its own shard of a
synthetic regression problem under ``DistributedDataParallel`` (gradients are all-reduced every step), prints its
progress, and rank 0 prints the final loss. A worker restarted after a rendezvous (a pod lost, a pod added) starts
over: put your checkpoint loading where the comment says.

Environment: ``STEPS`` (default 20), ``STEP_SECONDS`` (a pause per step, default 0.1, so that a round can be
watched), ``BATCH`` (samples per worker per step, default 64).

    torchrun --nnodes=1 --nproc-per-node=2 examples/train.py      # locally, c10d on one machine
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

FEATURES = 16


def main() -> None:
    steps = int(os.environ.get("STEPS", "20"))
    step_seconds = float(os.environ.get("STEP_SECONDS", "0.1"))
    batch = int(os.environ.get("BATCH", "64"))
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    print(f"rank {rank}/{world_size} restart {restart}: process group ready", flush=True)

    torch.manual_seed(0)  # every rank builds the same model and the same true weights
    true_weights = torch.randn(FEATURES, 1)
    model = DistributedDataParallel(torch.nn.Linear(FEATURES, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    # Load a checkpoint here (model, optimizer, step) to resume after a restart.
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    loss = torch.tensor(0.0)
    for step in range(steps):
        inputs = torch.randn(batch, FEATURES, generator=data)
        targets = inputs @ true_weights
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients across every worker of the round
        optimizer.step()
        print(f"rank {rank}/{world_size} step {step + 1}/{steps}: loss {loss.item():.4f}", flush=True)
        time.sleep(step_seconds)
    dist.barrier()
    if rank == 0:
        print(f"done: {steps} steps on {world_size} workers, final loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
