"""The DDP example of torch's tutorial "Getting Started with Distributed Data Parallel".

Its torchrun form (``elastic_ddp.py``), on CPU, with one line changed: the
backend given to ``init_process_group`` is ``"commlib"`` (the tutorial's is
``"nccl"``), so every collective DDP issues goes through commlib: checked,
timed out, recorded. ``"commlib"`` is the machine's default plugin: gloo on
a CPU machine, mpi under ``mpiexec``; ``"commlib-gloo"`` names one.

    torchrun --standalone --nproc-per-node 2 examples/ddp_tutorial.py

(The tutorial moves the model to ``device_id = rank % torch.cuda.device_count()``;
on CPU the model stays where it is and DDP takes no ``device_ids``.)
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()  # noqa: UP008  (the tutorial's line, kept)
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic():
    dist.init_process_group("commlib")
    rank = dist.get_rank()
    print(f"Start running basic DDP example on rank {rank}.")

    # create model (on CPU: the tutorial's .to(device_id) and device_ids=[device_id] dropped)
    model = ToyModel()
    ddp_model = DDP(model)

    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)

    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    dist.destroy_process_group()
    print(f"Finished running basic DDP example on rank {rank}.")


if __name__ == "__main__":
    demo_basic()
