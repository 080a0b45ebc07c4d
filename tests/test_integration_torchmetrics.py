"""torchmetrics on commlib (issue 13), against the real torchmetrics.

Metrics whose per-rank state is uneven (``cat`` states, a mean, AUROC's list
states, detection-style boxes of different counts per image, a rank with no
data) compute, synced through :func:`commlib.integrations.torchmetrics.gather_all_tensors`,
exactly what torchmetrics' own sync computes, on gloo worlds of 2 and 3 ranks,
also over a subgroup that is not a prefix of the world. Metrics used as a loss
(``dist_sync_on_step=True``) give the same gradient. An int16 state, which
gloo refuses, syncs too.

Functions named ``_on_*`` run inside the ranks (``fn(comm, ...)``).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "torchmetrics", reason="torchmetrics is not installed (pip install -e '.[integrations]')"
)

import torch.distributed as torch_dist
from torchmetrics import CatMetric, MeanMetric, Metric, MetricCollection, SumMetric
from torchmetrics.classification import BinaryAUROC
from torchmetrics.regression import MeanSquaredError

from commlib.integrations.torchmetrics import gather_all_tensors, use_commlib


class Boxes(Metric):
    """Detection-style state: one (n, 4) tensor of boxes per image, n differing per image."""

    full_state_update = False

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("boxes", default=[], dist_reduce_fx=None)

    def update(self, boxes: list[torch.Tensor]) -> None:
        self.boxes.extend(boxes)

    def compute(self):
        return [b.tolist() for b in self.boxes]


class Int16Counts(Metric):
    """A state of a dtype gloo refuses to move."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("counts", default=torch.zeros(3, dtype=torch.int16), dist_reduce_fx="sum")

    def update(self, counts: torch.Tensor) -> None:
        self.counts += counts.to(torch.int16)

    def compute(self):
        return self.counts


def _collection() -> MetricCollection:
    return MetricCollection(
        {
            "cat": CatMetric(),
            "mean": MeanMetric(),
            "auroc": BinaryAUROC(thresholds=None),  # list states: every prediction
            "boxes": Boxes(),
            "sum": SumMetric(),
        },
        compute_groups=False,
    )


def _feed(metrics: MetricCollection, rank: int) -> None:
    g = torch.Generator().manual_seed(100 + rank)
    if rank > 0:  # rank 0 sees no data for `cat`: its state is an empty list
        metrics["cat"].update(torch.arange(rank * 10.0, rank * 10.0 + rank + 1))
    metrics["mean"].update(torch.rand(rank + 2, generator=g), weight=torch.full((rank + 2,), 2.0))
    n = 3 + 2 * rank
    metrics["auroc"].update(torch.rand(n, generator=g), torch.arange(n) % 2)
    # two images per rank, of rank + 1 and rank boxes (rank 0's second image: none)
    images = [torch.rand(rank + 1, 4, generator=g), torch.rand(rank, 4, generator=g)]
    metrics["boxes"].update(images)
    metrics["sum"].update(torch.tensor(float(rank)))


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _on_collection(comm, through_commlib: bool, subgroup: list[int] | None = None):
    group = None
    if subgroup is not None:  # every rank makes the group; its members sync over it
        group = comm.new_group(subgroup) if through_commlib else torch_dist.new_group(subgroup)
        if comm.rank not in subgroup:
            return None
    metrics = _collection()
    if through_commlib:
        use_commlib(metrics, group=group)
    elif group is not None:
        for metric in metrics.values():
            metric.process_group = group
    _feed(metrics, comm.rank)
    return _plain(metrics.compute())


def test_uneven_states_equal_torchmetrics_own_sync(world2, world3):
    for world in (world2, world3):
        own = world.run(_on_collection, False)
        ours = world.run(_on_collection, True)
        assert ours == own
        # the states really were uneven and really were gathered
        assert len(ours[0]["boxes"]) == 2 * world.size
        assert len(ours[0]["cat"]) == sum(r + 1 for r in range(1, world.size))


def test_a_subgroup_that_is_not_a_prefix_of_the_world(world3):
    own = world3.run(_on_collection, False, [1, 2])
    ours = world3.run(_on_collection, True, [1, 2])
    assert ours == own and ours[0] is None
    assert len(ours[1]["boxes"]) == 4


def _on_loss(comm, through_commlib: bool):
    sync = gather_all_tensors if through_commlib else None
    n = 2 + comm.rank  # uneven batches
    out = {}
    for name, metric in (
        ("mse", MeanSquaredError(dist_sync_on_step=True, dist_sync_fn=sync)),
        ("cat", CatMetric(dist_sync_on_step=True, dist_sync_fn=sync)),
    ):
        preds = torch.linspace(0.0, 1.0, n).add(comm.rank).requires_grad_()
        if name == "mse":
            loss = metric(preds, torch.zeros(n))
        else:
            loss = metric(preds).pow(2).sum()  # every rank's batch, gathered
        loss.backward()
        out[name] = (loss.item(), preds.grad.tolist())
    return out


def test_a_metric_used_as_a_loss_backpropagates(world2, world3):
    for world in (world2, world3):
        own = world.run(_on_loss, False)
        ours = world.run(_on_loss, True)
        assert ours == own
        for rank, got in enumerate(ours):
            n = 2 + rank
            preds = torch.linspace(0.0, 1.0, n).add(rank)
            total = sum(2 + r for r in range(world.size))
            # d/dp of the mean over every rank's elements: this rank's share only
            assert got["mse"][1] == pytest.approx((2 * preds / total).tolist())
            assert got["cat"][1] == pytest.approx((2 * preds).tolist())


def _on_int16(comm):
    metric = use_commlib(Int16Counts())
    metric.update(torch.tensor([1, comm.rank, 300]))
    return metric.compute().tolist()


def test_an_int16_state_syncs(world3):
    # torchmetrics' own sync hands int16 to gloo, which refuses it
    assert world3.run(_on_int16) == [[3, 3, 900]] * 3


def test_use_commlib_sets_every_metric_and_checks_its_argument():
    collection = _collection()
    assert use_commlib(collection) is collection
    assert all(m.dist_sync_fn is gather_all_tensors for m in collection.values())
    wrapped = torch.nn.ModuleDict({"inner": MeanMetric()})
    group = object()
    use_commlib(wrapped, group=group)
    assert wrapped["inner"].process_group is group
    with pytest.raises(TypeError, match="torchmetrics Metric"):
        use_commlib([MeanMetric()])
    with pytest.raises(ValueError, match="holds no torchmetrics Metric"):
        use_commlib(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"needs a torch\.Tensor"):
        gather_all_tensors([1.0])


def test_a_world_of_one():
    metric = MeanMetric(dist_sync_fn=gather_all_tensors)
    metric.update(torch.tensor([1.0, 3.0]))
    assert metric.compute().item() == 2.0
    (only,) = gather_all_tensors(torch.ones(2))
    assert torch.equal(only, torch.ones(2))
