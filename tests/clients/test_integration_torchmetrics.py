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
from torchmetrics.utilities import dim_zero_cat

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


class Rows(Metric):
    """A 2-D ``cat`` state: (n, 4) rows per update, n differing per rank."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("rows", default=[], dist_reduce_fx="cat")

    def update(self, rows: torch.Tensor) -> None:
        self.rows.append(rows)

    def compute(self):
        return dim_zero_cat(self.rows).tolist()


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


def _on_a_rank_without_data(comm):
    # rank 1 saw no batch at all (fewer eval batches than ranks): its list states
    # are torchmetrics' placeholder, float32 and 1-D, where the others hold int64
    # targets (AUROC) and (n, 4) rows
    metrics = MetricCollection(
        {"auroc": BinaryAUROC(thresholds=None), "rows": Rows()},
        compute_groups=False,  # groups formed at update would differ on the rank without any
    )
    use_commlib(metrics)
    if comm.rank != 1:
        g = torch.Generator().manual_seed(7 + comm.rank)
        metrics["auroc"].update(torch.rand(4, generator=g), torch.tensor([0, 1, 0, 1]))
        metrics["rows"].update(torch.full((comm.rank + 1, 4), float(comm.rank)))
    return _plain(metrics.compute())


def test_a_rank_without_data_syncs_int64_and_2d_list_states(world3):
    got = world3.run(_on_a_rank_without_data)
    assert got[0] == got[1] == got[2]
    # what one metric fed every rank's data computes (torchmetrics' own sync fails
    # here: gloo refuses the placeholder beside int64 and 2-D states)
    alone = BinaryAUROC(thresholds=None)
    for r in (0, 2):
        g = torch.Generator().manual_seed(7 + r)
        alone.update(torch.rand(4, generator=g), torch.tensor([0, 1, 0, 1]))
    assert got[0]["auroc"] == pytest.approx(alone.compute().item())
    assert got[0]["rows"] == [[0.0] * 4] + [[2.0] * 4] * 3
