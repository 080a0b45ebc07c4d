"""``commlib.init_dist(serve_torch=True)`` under torchrun: torch's world is commlib's."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import commlib
from commlib.torch_backend import communicator_of

commlib.init_dist("pytorch", backend="gloo", serve_torch=True)
assert dist.get_backend() == "commlib-gloo", dist.get_backend()
# commlib's calls and torch's share the world's one communicator
comm = commlib.get_communicator()
assert comm is communicator_of(dist.group.WORLD) and comm.backend == "gloo"
t = torch.ones(2)
commlib.all_reduce(t)
dist.all_reduce(t)
assert t.tolist() == [4.0, 4.0], t
ddp = DDP(torch.nn.Linear(4, 2))
ddp(torch.randn(3, 4)).sum().backward()
print(f"rank {dist.get_rank()}: served, {comm.checks}")
