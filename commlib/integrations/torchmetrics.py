"""torchmetrics: metric states synchronised through commlib.

torchmetrics gathers every metric state with a ``dist_sync_fn`` (by default
its own ``gather_all_tensors`` on torch.distributed). :func:`gather_all_tensors`
here is the same contract on commlib's ``all_gather``: states whose shapes
differ across ranks (``cat`` states, AUROC-style lists, boxes of different
counts), every dtype (gloo rejects int16, uint16/32/64 and float8; commlib's
backends send those as raw bytes), any commlib backend, and a timeout instead
of a hang when a rank does not join. This rank's own entry is its tensor
itself, so a metric used as a loss (``dist_sync_on_step=True``) keeps its
gradient.

Examples:
    >>> from torchmetrics import MeanMetric                       # doctest: +SKIP
    >>> metric = MeanMetric(dist_sync_fn=gather_all_tensors)     # doctest: +SKIP
    >>> use_commlib(MetricCollection([...]))     # every metric in it  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from commlib.functional import get_communicator
from commlib.integrations._clients import require

M = TypeVar("M")


def gather_all_tensors(result: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
    """Every rank's ``result``, indexed by rank: a ``dist_sync_fn`` for torchmetrics.

    ``group`` is what torchmetrics passes on from a metric's
    ``process_group``: ``None`` (the world), a torch ``ProcessGroup`` or a
    :class:`~commlib.Communicator`. Shapes may differ across ranks (same dtype
    and number of dims). A rank with no data may hold any empty tensor
    (torchmetrics' placeholder for an empty list state is a float32 one): it
    takes the dtype and dims of the ranks with data, so an int64 or 2-D list
    state still syncs. This rank's entry is ``result`` itself, so gradients
    flow through it; the others are new tensors.

    Examples:
        >>> gather_all_tensors(torch.tensor([1.0, 2.0]))      # a world of one
        [tensor([1., 2.])]
        >>> x = torch.ones(3, requires_grad=True)
        >>> torch.cat(gather_all_tensors(x)).sum().backward()
        >>> x.grad
        tensor([1., 1., 1.])
        >>> # 2 ranks holding 1 and 3 values: [tensor([0.]), tensor([1., 2., 3.])] on both
    """
    if not isinstance(result, torch.Tensor):
        raise TypeError(f"gather_all_tensors needs a torch.Tensor, got {type(result).__name__}")
    return get_communicator(group).all_gather(result, adapt_empty=True)


def use_commlib(metrics: M, group: Any = None) -> M:
    """Make every torchmetrics ``Metric`` in ``metrics`` sync through commlib; returns ``metrics``.

    ``metrics`` is a ``Metric``, a ``MetricCollection`` or any ``torch.nn.Module``
    holding metrics (wrappers and compositions included). Each gets
    :func:`gather_all_tensors` as its ``dist_sync_fn``; with ``group`` given (a
    torch ``ProcessGroup`` or a :class:`~commlib.Communicator`), also that
    ``process_group``. Metrics added to a collection later are not changed.

    Examples:
        >>> from torchmetrics import MetricCollection, MeanMetric, SumMetric  # doctest: +SKIP
        >>> both = use_commlib(MetricCollection([MeanMetric(), SumMetric()]))  # doctest: +SKIP
        >>> both["MeanMetric"].dist_sync_fn is gather_all_tensors              # doctest: +SKIP
        True
    """
    torchmetrics = require("torchmetrics", "torchmetrics", "commlib.integrations.torchmetrics")
    if not isinstance(metrics, torch.nn.Module):
        raise TypeError(
            "use_commlib needs a torchmetrics Metric, a MetricCollection or a module holding "
            f"metrics, got {type(metrics).__name__}"
        )
    found = [m for m in metrics.modules() if isinstance(m, torchmetrics.Metric)]
    if not found:
        raise ValueError(f"use_commlib: {type(metrics).__name__} holds no torchmetrics Metric")
    for metric in found:
        metric.dist_sync_fn = gather_all_tensors
        if group is not None:
            metric.process_group = group
    return metrics
