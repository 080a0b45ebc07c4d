"""commlib inside mmengine (issue 13), against the real mmengine.

* ``patch()`` / ``unpatch()`` / ``patched()`` route ``mmengine.dist`` and every
  reference mmengine's modules imported from it (also those imported while
  patched) to commlib and back; idempotent, nestable;
* a real ``Evaluator`` with uneven per-rank parts and a ``Runner(...).val()``
  give, with commlib patched in, exactly what mmengine gives on its own, on
  gloo worlds of 2 and 3 ranks; the flight recorder shows commlib did the work.

Functions named ``_on_*`` run inside the ranks (``fn(comm, ...)``).
"""

from __future__ import annotations

import contextlib
import sys
import types
import uuid

import numpy as np
import pytest
import torch

pytest.importorskip(
    "mmengine", reason="mmengine is not installed (pip install -e '.[integrations]')"
)

import mmengine.dist
import mmengine.evaluator
import mmengine.runner
from mmengine.evaluator import BaseMetric, Evaluator
from mmengine.model import BaseModel

import commlib
from commlib.integrations import mmengine as mm
from commlib.plugins import plugin_manager

NAMES = list(mmengine.dist.__all__)
ORIGINALS = {name: getattr(mmengine.dist, name) for name in NAMES}


def _references(of: dict) -> list[str]:
    """``module.attr`` for every attribute of a loaded mmengine module that is in ``of``."""
    ids = {id(fn) for fn in of.values()}
    return sorted(
        f"{name}.{attr}"
        for name, module in list(sys.modules.items())
        if name.split(".", 1)[0] == "mmengine" and isinstance(module, types.ModuleType)
        for attr, value in vars(module).items()
        if id(value) in ids
    )


@pytest.fixture(autouse=True)
def _unpatched_after():
    yield
    mm.unpatch()
    assert not mm.is_patched() and not _references(_commlib_functions())


def _commlib_functions() -> dict:
    return {name: getattr(commlib, name) for name in NAMES}


# -- patching, in this process ---------------------------------------------------------------
def test_every_reference_goes_to_commlib_and_back():
    before = _references(ORIGINALS)
    # mmengine's own modules hold their copies: these are what a plain patch of
    # mmengine.dist would miss
    for where in (
        "mmengine.evaluator.metric.collect_results",
        "mmengine.runner.runner.broadcast",
        "mmengine.dataset.sampler.sync_random_seed",
        "mmengine.dist.dist.get_world_size",
        "mmengine.dist.utils.is_main_process",
    ):
        assert where in before
    with mm.patched():
        assert mm.is_patched()
        for name in NAMES:
            assert getattr(mmengine.dist, name) is getattr(commlib, name), name
        assert mmengine.evaluator.metric.collect_results is commlib.collect_results
        assert mmengine.runner.runner.broadcast is commlib.broadcast
        assert not _references(ORIGINALS)
        assert _references(_commlib_functions()) == before
    assert not mm.is_patched()
    assert _references(ORIGINALS) == before
    assert mmengine.evaluator.metric.collect_results is ORIGINALS["collect_results"]


def test_patch_is_idempotent_and_nests():
    replaced = mm.patch()
    assert replaced == len(_references(_commlib_functions())) > 0
    assert mm.patch() == 0  # already patched
    with mm.patched():  # an inner block leaves the outer patch in force
        pass
    assert mm.is_patched() and mmengine.dist.all_reduce is commlib.all_reduce
    assert mm.unpatch() == replaced
    assert mm.unpatch() == 0
    assert mmengine.dist.all_reduce is ORIGINALS["all_reduce"]


def test_unpatch_after_an_error_in_the_block():
    with pytest.raises(ZeroDivisionError), mm.patched():
        _ = 1 / 0
    assert not mm.is_patched() and mmengine.dist.barrier is ORIGINALS["barrier"]


def test_modules_imported_while_patched_are_restored_too():
    late = types.ModuleType("mmengine._commlib_late_import")
    sys.modules[late.__name__] = late
    try:
        with mm.patched():
            exec("from mmengine.dist import get_rank, collect_results as gather_all", vars(late))
            assert late.get_rank is commlib.get_rank
            assert late.gather_all is commlib.collect_results
        assert late.get_rank is ORIGINALS["get_rank"]
        assert late.gather_all is ORIGINALS["collect_results"]
    finally:
        del sys.modules[late.__name__]


def test_also_patches_the_packages_named():
    downstream = types.ModuleType("commlib_test_downstream")
    downstream.all_gather_object = ORIGINALS["all_gather_object"]
    downstream.unrelated = print
    sys.modules[downstream.__name__] = downstream
    try:
        mm.patch(also=[downstream.__name__])
        assert downstream.all_gather_object is commlib.all_gather_object
        assert downstream.unrelated is print
        mm.unpatch()
        assert downstream.all_gather_object is ORIGINALS["all_gather_object"]
    finally:
        del sys.modules[downstream.__name__]
        mm._packages.discard(downstream.__name__)


@pytest.mark.parametrize("bad", ["mmdet.models", "", 3])
def test_also_takes_package_names_only(bad):
    with pytest.raises(ValueError, match="top-level package names"):
        mm.patch(also=[bad])
    assert not mm.is_patched()


def test_a_world_of_one_runs_mmengine_code_on_commlib():
    with mm.patched():
        assert mmengine.dist.get_dist_info() == (0, 1)
        assert mmengine.dist.all_gather_object({"a": 1}) == [{"a": 1}]
        assert mmengine.dist.collect_results([1, 2, 3], 2) == [1, 2]


# -- mmengine's Evaluator and Runner on gloo worlds -----------------------------------------
class IndexMetric(BaseMetric):
    """Keeps each sample's index, a tensor and an array; its metrics show order and content."""

    default_prefix = "idx"

    def process(self, data_batch, data_samples):
        for sample in data_samples:
            i = int(sample["index"])
            self.results.append(
                {"index": i, "score": torch.tensor(float(sample["score"])), "row": np.full(3, i)}
            )

    def compute_metrics(self, results):
        return {
            "count": len(results),
            # position-weighted: a different order gives a different number
            "order": sum(pos * r["index"] for pos, r in enumerate(results)),
            "score": round(float(sum(r["score"] for r in results)), 4),
            "rows": int(sum(r["row"].sum() for r in results)),
        }


def _expected(size: int, score=lambda i: 0.5 * i) -> dict:
    return {
        "idx/count": size,
        "idx/order": sum(i * i for i in range(size)),
        "idx/score": round(sum(score(i) for i in range(size)), 4),
        "idx/rows": 3 * sum(range(size)),
    }


class _Names:
    """An observer: the names of the commlib collectives that ran."""

    def __init__(self):
        self.names: set[str] = set()

    @commlib.hookimpl
    def commlib_collective_end(self, event):
        self.names.add(event.name)


@contextlib.contextmanager
def _recording():
    """The names of the commlib collectives run inside the block."""
    observer = _Names()
    plugin_manager().register(observer)
    try:
        yield observer.names
    finally:
        plugin_manager().unregister(observer)


def _on_evaluator(comm, size: int, through_commlib: bool):
    rank, world = comm.rank, comm.world_size
    mine = list(range(rank, size, world))  # uneven: the first ranks hold one more
    with _recording() as used, mm.patched() if through_commlib else contextlib.nullcontext():
        evaluator = Evaluator(IndexMetric())
        for start in range(0, len(mine), 2):
            evaluator.process([{"index": i, "score": 0.5 * i} for i in mine[start : start + 2]])
        metrics = evaluator.evaluate(size)
    return metrics, sorted(used)


@pytest.mark.parametrize("size", [7, 2])
def test_evaluator_with_uneven_parts_equals_mmengine(size, world2, world3):
    for world in (world2, world3):
        own = world.run(_on_evaluator, size, False)
        ours = world.run(_on_evaluator, size, True)
        assert [m for m, _ in own] == [m for m, _ in ours] == [_expected(size)] * world.size
        assert all(used == [] for _, used in own)  # mmengine's run: torch.distributed only
        for _, used in ours:  # collect_results, then the metrics from rank 0
            assert {"all_gather_object", "broadcast_object_list"} <= set(used)


class TinyModel(BaseModel):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)
        torch.nn.init.constant_(self.linear.weight, 0.5)
        torch.nn.init.constant_(self.linear.bias, 0.0)

    def forward(self, inputs, data_samples=None, mode="tensor"):
        scores = self.linear(torch.stack(inputs)).squeeze(1)
        if mode == "loss":
            return {"loss": scores.sum()}
        return [{"index": int(i), "score": float(s)} for i, s in zip(data_samples, scores)]


class TinyDataset(torch.utils.data.Dataset):
    def __init__(self, size: int):
        self.size = size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        return {"inputs": torch.tensor([float(i), 1.0]), "data_samples": i}


def _on_runner_val(comm, size: int, work_dir: str, through_commlib: bool):
    from mmengine.runner import Runner

    name = f"commlib-{'patched' if through_commlib else 'own'}-{uuid.uuid4().hex[:8]}"
    name = commlib.broadcast_object(name)  # one experiment name for every rank
    with _recording() as used, mm.patched() if through_commlib else contextlib.nullcontext():
        runner = Runner(
            model=TinyModel(),
            work_dir=work_dir,
            experiment_name=name,
            val_dataloader={
                "dataset": TinyDataset(size),
                # padded to equal parts, then cut back to `size` by collect_results
                "sampler": {"type": "DefaultSampler", "shuffle": False},
                "batch_size": 2,
                "num_workers": 0,
            },
            val_cfg={},
            val_evaluator=Evaluator(IndexMetric()),
            launcher="pytorch",  # torch.distributed already runs: the Runner joins it
            # DDP on CPU takes no device_ids (mmengine would pass LOCAL_RANK)
            cfg={"model_wrapper_cfg": {"type": "MMDistributedDataParallel", "device_ids": None}},
            default_hooks={"checkpoint": None},
            log_level="ERROR",
        )
        metrics = runner.val()
    return metrics, sorted(used)


def test_runner_val_with_commlib_equals_mmengine(world2, world3, tmp_path):
    size = 7
    expected = _expected(size, score=lambda i: 0.5 * (i + 1))  # the model: 0.5*x + 0.5
    for world in (world2, world3):
        own = world.run(_on_runner_val, size, str(tmp_path / f"own{world.size}"), False)
        ours = world.run(_on_runner_val, size, str(tmp_path / f"ours{world.size}"), True)
        assert [m for m, _ in own] == [m for m, _ in ours] == [expected] * world.size
        for _, used in ours:  # the timestamp and seed, collect_results, the metrics
            assert {"broadcast", "all_gather_object", "broadcast_object_list"} <= set(used)
