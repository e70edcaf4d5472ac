#!/usr/bin/env python3
"""PyTorch Lightning DDP through the launch contract: a few steps of a tiny model whose
parameters must end identical on every rank, and a world that must equal the launcher's.

    mpirun -np 2 -H a:1,b:1 -x MASTER_ADDR=a tb-launch python lightning_ddp.py     # per process
    torchrun --nnodes 2 --nproc-per-node 1 --node-rank N --master-addr a lightning_ddp.py

tb-launch sets what Lightning's TorchElasticEnvironment reads (RANK, GROUP_RANK, LOCAL_RANK,
LOCAL_WORLD_SIZE, WORLD_SIZE, MASTER_*) and the Trainer defaults PL_TRAINER_NUM_NODES and
PL_TRAINER_DEVICES, so the Trainer below needs neither `devices` nor `num_nodes`. Passing a
`--devices` that differs from the ranks per node makes every rank stop with Lightning's own
"does not match the world size" error, instead of one rank failing and rank 0 hanging.
"""

import argparse
import hashlib
import os
import sys
import warnings

import lightning as L
import torch
import torch.distributed as dist


class TinyRegression(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # same initial parameters on every rank
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def training_step(self, batch, _):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def parameters_agree(model: torch.nn.Module, world: int, rank: int) -> str:
    """The digest of this rank's parameters, after checking every rank has the same one."""
    flat = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    digest = hashlib.sha256(repr(flat.tolist()).encode()).hexdigest()
    digests = [None] * world
    dist.all_gather_object(digests, digest)
    assert len(set(digests)) == 1, f"rank {rank}: parameters differ across ranks: {digests}"
    return digest


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", default=None, help="override Lightning's devices (default: from the launch)")
    ap.add_argument(
        "--num-nodes", default=None, help="override Lightning's num_nodes (Azure ML type: pytorch gives no node count)"
    )
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    data = torch.utils.data.TensorDataset(torch.randn(256, 8, generator=torch.Generator().manual_seed(7)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)  # Lightning adds the DistributedSampler
    extra = {k: int(v) for k, v in (("devices", a.devices), ("num_nodes", a.num_nodes)) if v}
    trainer = L.Trainer(
        accelerator="auto",
        strategy="ddp",
        max_steps=a.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **extra,
    )
    model = TinyRegression()
    # the launcher's world, read before fit: Lightning's own environment (LightningEnvironment,
    # chosen under Azure ML's type: pytorch) deletes WORLD_SIZE when it tears down
    launched = os.environ.get("WORLD_SIZE")
    trainer.fit(model, loader)

    env = type(trainer.strategy.cluster_environment).__name__
    world, rank = trainer.world_size, trainer.global_rank
    if launched is None:
        # started as one process with no launcher (`python lightning_ddp.py` on a GPU node):
        # Lightning starts its own processes, one per device on each node, so that is the world
        want, source = trainer.num_devices * trainer.num_nodes, "Lightning's own launch (devices x nodes)"
    else:
        want, source = int(launched), "the launcher's WORLD_SIZE"
    assert world == want, f"Lightning sees a world of {world}, {source} is {want} ({env})"
    digest = parameters_agree(model, world, rank)
    os.write(
        1,
        (
            f"OK rank={rank} world={world} node_rank={trainer.node_rank} local_rank={trainer.local_rank} "
            f"env={env} params={digest[:12]}\n"
        ).encode(),
    )
    # leave together, and tear the process group down before the interpreter does: with torch
    # 2.15 a group still alive at exit sometimes aborted one rank ("terminate called without an
    # active exception", signal 6) after training had succeeded (seen in 1 of 2 runs on a 2-core x86_64 host)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
