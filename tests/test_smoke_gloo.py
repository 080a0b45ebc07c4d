import torch


def _sum(comm, x):
    t = torch.tensor([x + comm.rank])
    comm.all_reduce(t)
    return int(t)


def _objs(comm):
    return comm.all_gather_object({"rank": comm.rank, "big": list(range(3000 * comm.rank))})


def test_smoke(world):
    n = world.size
    assert world.run(_sum, 10) == [10 * n + n * (n - 1) // 2] * n
    res = world.run(_objs)
    assert all(r == [{"rank": i, "big": list(range(3000 * i))} for i in range(n)] for r in res)
