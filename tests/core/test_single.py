"""The core on the ``single`` backend: a world of one, no torch.distributed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import commlib
from commlib import Communicator
from commlib.errors import NotInGroupError


@pytest.fixture(autouse=True)
def _not_distributed():
    assert not dist.is_initialized()


def test_identity():
    comm = commlib.get_communicator()
    assert comm.backend == "single"
    assert (comm.rank, comm.world_size, comm.local_rank, comm.local_size) == (0, 1, 0, 1)
    assert comm.device == torch.device("cpu")
    assert commlib.get_dist_info() == (0, 1)
    assert commlib.get_backend() is None
    assert commlib.get_default_group() is None
    assert not commlib.is_distributed()
    assert commlib.is_main_process()
    assert commlib.get_local_rank() == 0 and commlib.get_local_size() == 1
    assert commlib.get_communicator() is comm  # cached


@pytest.mark.parametrize("op", ["sum", "mean", "product", "min", "max", "SUM", "Mean"])
def test_all_reduce_is_identity(op):
    x = torch.tensor([1.5, -2.0])
    commlib.all_reduce(x, op)
    assert torch.equal(x, torch.tensor([1.5, -2.0]))


@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
def test_bitwise_ops_on_ints(op):
    x = torch.tensor([5, 3])
    commlib.all_reduce(x, op)
    assert x.tolist() == [5, 3]


def test_mean_of_int_keeps_dtype():
    x = torch.tensor([3, 4])
    commlib.all_reduce(x, "mean")
    assert x.dtype == torch.int64 and x.tolist() == [3, 4]


def test_tensor_collectives():
    x = torch.arange(4.0).reshape(2, 2)
    out = commlib.all_gather(x)
    assert isinstance(out, list) and len(out) == 1 and torch.equal(out[0], x)
    assert [torch.equal(t, x) for t in commlib.gather(x)] == [True]
    y = x.clone()
    commlib.broadcast(y)
    assert torch.equal(y, x)
    flat = torch.empty(4)
    commlib.all_gather_into_tensor(flat, x.reshape(-1))
    assert torch.equal(flat, x.reshape(-1))
    rs = torch.empty(2, 2)
    commlib.reduce_scatter(rs, x)
    assert torch.equal(rs, x)
    rs_list = torch.empty(2, 2)
    commlib.reduce_scatter(rs_list, [x])
    assert torch.equal(rs_list, x)
    commlib.barrier()


def test_async_handles():
    x = torch.ones(3)
    h = commlib.all_reduce(x, "mean", async_op=True)
    assert h.wait() is True and h.is_completed()
    h = commlib.broadcast(x, async_op=True)
    assert h.wait()


def test_object_collectives_follow_mmengine_conventions():
    data = {"a": [1, 2], "t": torch.ones(2)}
    gathered = commlib.all_gather_object(data)
    assert isinstance(gathered, list) and len(gathered) == 1 and gathered[0] is data
    assert commlib.gather_object(data)[0] is data
    objs = ["foo", 12, {1: 2}]
    assert commlib.broadcast_object_list(objs) is None
    assert objs == ["foo", 12, {1: 2}]
    assert commlib.broadcast_object("x") == "x"


def test_helpers():
    d = {"b": torch.tensor(2.0), "a": torch.tensor([1, 2])}
    commlib.all_reduce_dict(d, "mean")
    assert d["b"].item() == 2.0 and d["a"].tolist() == [1, 2]
    params = [torch.ones(3), torch.zeros(2, dtype=torch.float64)]
    commlib.all_reduce_params(params, bucket_size_mb=1, op="mean")
    assert params[0].tolist() == [1, 1, 1]
    assert commlib.collect_results([1, None, 3], 2) == [1, None]
    assert commlib.collect_results([1, 2, 3], 2, device="gpu") == [1, 2]
    assert commlib.collect_results_cpu([1, 2], 5) == [1, 2]
    assert commlib.collect_results_gpu([1, 2], 1) == [1]
    x = torch.tensor([2.0, 4.0])
    m = commlib.reduce_mean(x)
    assert torch.equal(m, x) and m is not x
    sizes, padded = commlib.pad_to_largest_tensor(torch.ones(3, 2))
    assert sizes == [3] and padded.shape == (3, 2)
    assert commlib.tensor2obj(commlib.obj2tensor({"k": (1, 2)})) == {"k": (1, 2)}


def test_sync_random_seed_follows_numpy():
    np.random.seed(123)
    a = commlib.sync_random_seed()
    np.random.seed(123)
    assert commlib.sync_random_seed() == a == int(np.random.RandomState(123).randint(2**31))


def test_rank_zero_only_and_master_only():
    @commlib.rank_zero_only
    def f(x):
        return x + 1

    @commlib.master_only
    def g(x):
        return x * 2

    assert f(1) == 2 and g(2) == 4
    assert f.__name__ == "f"


def test_new_group_of_one():
    sub = commlib.new_group([0])
    assert sub.is_member and sub.world_size == 1
    with pytest.raises(ValueError):
        commlib.new_group([0, 1])


# -- bad arguments: clear errors, nothing sent -------------------------------------


@pytest.mark.parametrize("op", ["avg", "sum ", "", "median"])
def test_unknown_op(op):
    with pytest.raises(ValueError, match="unknown reduce op"):
        commlib.all_reduce(torch.ones(1), op)


def test_non_string_op_type():
    with pytest.raises(TypeError):
        commlib.all_reduce(torch.ones(1), 3)


def test_reduce_op_enum_is_accepted():
    x = torch.ones(2)
    commlib.all_reduce(x, dist.ReduceOp.SUM)
    assert x.tolist() == [1.0, 1.0]


def test_bitwise_op_on_float():
    with pytest.raises(TypeError, match="integer or bool"):
        commlib.all_reduce(torch.ones(1), "band")


@pytest.mark.parametrize(
    "call",
    [
        lambda: commlib.gather("x"),
        lambda: commlib.reduce_scatter(torch.empty(1), 5),
        lambda: commlib.reduce_mean([1.0]),
        lambda: commlib.all_reduce_params([torch.ones(1), 2]),
        lambda: commlib.all_reduce_dict({"a": 1}),
    ],
)
def test_non_tensor(call):
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        call()


def test_python_values_and_structures_are_not_refused():
    # once TypeErrors: numbers, objects and structures are what ignite and accelerate pass
    assert commlib.all_reduce([1, 2]) == [1, 2]
    assert commlib.all_gather(np.ones(2))[0].tolist() == [1.0, 1.0]
    assert commlib.broadcast(3) == 3
    with pytest.raises(TypeError, match="reduces tensors and numbers"):
        commlib.all_reduce(["x"])


@pytest.mark.parametrize("bad", [1, -1, 7])
def test_ranks_out_of_range(bad):
    with pytest.raises(ValueError, match="out of range"):
        commlib.broadcast(torch.ones(1), src=bad)
    with pytest.raises(ValueError, match="out of range"):
        commlib.gather(torch.ones(1), dst=bad)
    with pytest.raises(ValueError, match="out of range"):
        commlib.gather_object(1, dst=bad)
    with pytest.raises(ValueError, match="out of range"):
        commlib.broadcast_object_list([1], src=bad)


def test_rank_must_be_int():
    with pytest.raises(TypeError):
        commlib.broadcast(torch.ones(1), src="0")
    with pytest.raises(TypeError):
        commlib.gather(torch.ones(1), dst=True)


@pytest.mark.parametrize("bad", ["abc", ("a",), None, {"a": 1}])
def test_broadcast_object_list_needs_list(bad):
    with pytest.raises(TypeError, match="needs a list"):
        commlib.broadcast_object_list(bad)


@pytest.mark.parametrize("bad", [[("a", torch.ones(1))], None, torch.ones(1)])
def test_all_reduce_dict_needs_dict(bad):
    with pytest.raises(TypeError, match="dict"):
        commlib.all_reduce_dict(bad)


def test_size_checks():
    with pytest.raises(ValueError, match="world_size"):
        commlib.all_gather_into_tensor(torch.empty(3), torch.ones(2))
    with pytest.raises(TypeError, match="dtype"):
        commlib.all_gather_into_tensor(torch.empty(2, dtype=torch.int64), torch.ones(2))
    with pytest.raises(ValueError, match="input tensors"):
        commlib.reduce_scatter(torch.empty(1), [torch.ones(1), torch.ones(1)])
    with pytest.raises(ValueError, match="world_size"):
        commlib.reduce_scatter(torch.empty(1), torch.ones(2))


def test_collect_results_arguments():
    with pytest.raises(ValueError, match="device"):
        commlib.collect_results([1], 1, device="tpu")
    with pytest.raises(ValueError, match="tmpdir"):
        commlib.collect_results([1], 1, device="gpu", tmpdir="/tmp")
    with pytest.raises(TypeError):
        commlib.collect_results("abc", 1)
    with pytest.raises(ValueError):
        commlib.collect_results([1], -1)


def test_pad_to_largest_needs_dims():
    with pytest.raises(ValueError):
        commlib.pad_to_largest_tensor(torch.tensor(1.0))


def test_communicator_arguments():
    with pytest.raises(ValueError):
        Communicator(slot_size=8)
    with pytest.raises(ValueError, match="unknown commlib backend"):
        Communicator(backend="nope")
    with pytest.raises(ValueError, match="not initialised"):
        Communicator(group=object())
    # a distributed backend named before any process group: say so, and the way out
    with pytest.raises(ValueError, match=r"'gloo' drives torch.distributed .*init_dist"):
        Communicator(backend="gloo")


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 1e300, -1.0, "30"])
def test_timeouts_that_are_no_duration(timeout):
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds"):
        Communicator().all_reduce(torch.ones(1), timeout=timeout)


@pytest.mark.parametrize(
    ("tensor", "op", "needle"),
    [
        (torch.ones(2, dtype=torch.complex64), "max", "no order"),
        (torch.ones(2, dtype=torch.complex64), "min", "no order"),
        (torch.ones(2, device="meta"), "sum", "meta tensor"),
        (torch.ones(2).to_sparse(), "sum", "sparse_coo tensor"),
    ],
)
def test_tensors_no_engine_can_reduce_are_refused_first(tensor, op, needle):
    # torch's own errors came from inside the engine, after the check's round
    with pytest.raises(TypeError, match=needle):
        Communicator().all_reduce(tensor, op)


def test_not_in_group_error_is_value_error():
    assert issubclass(NotInGroupError, ValueError)


def test_unpicklable_objects_are_fine_in_a_world_of_one():
    # mmengine returns [data] without pickling at world size 1; so does commlib
    f = lambda: 1  # noqa: E731
    assert commlib.all_gather_object(f)[0] is f
    assert commlib.gather_object(f)[0] is f
    box = [f]
    commlib.broadcast_object_list(box)
    assert box[0] is f


# -- the collectives beyond mmengine's, in a world of one ---------------------------------
def test_reduce_scatter_and_all_to_all_in_a_world_of_one():
    x = torch.tensor([3, 4])
    assert commlib.reduce(x, op="mean") is None and x.tolist() == [3, 4]
    out = torch.empty(2)
    commlib.scatter(out, [torch.ones(2)])
    assert out.tolist() == [1.0, 1.0]
    outs = [torch.empty(2)]
    commlib.all_to_all(outs, [torch.arange(2.0)])
    assert outs[0].tolist() == [0.0, 1.0]
    single = torch.empty(3, 2)
    commlib.all_to_all_single(single, torch.ones(3, 2), [3], [3])
    assert single.tolist() == [[1.0, 1.0]] * 3
    for handle in (
        commlib.reduce(x, async_op=True),
        commlib.scatter(out, [torch.ones(2)], async_op=True),
        commlib.all_to_all_single(single, torch.ones(3, 2), async_op=True),
        commlib.barrier(async_op=True),
    ):
        assert handle.wait() is True


def test_all_gather_keeps_the_callers_tensor():
    x = torch.ones(2, requires_grad=True)
    gathered = commlib.all_gather(x)
    assert gathered[0] is x
    gathered[0].sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]


def test_object_collectives_take_async_op_and_timeout():
    data = {"a": 1}
    assert commlib.all_gather_object(data, async_op=True).wait()[0] is data
    assert commlib.gather_object(data, timeout=5, async_op=True).wait() == [data]
    assert commlib.broadcast_object("x", async_op=True).wait() == "x"
    objs = [1, 2]
    assert commlib.broadcast_object_list(objs, timeout=5.0, async_op=True).wait() is None
    box = [None]
    handle = commlib.scatter_object_list(box, [data], async_op=True)
    assert handle.is_completed() and handle.wait() is None and box[0] is data


def test_point_to_point_needs_another_rank():
    with pytest.raises(ValueError, match="this rank itself"):
        commlib.send(torch.ones(1), dst=0)
    with pytest.raises(ValueError, match="this rank itself"):
        commlib.irecv(torch.ones(1), src=0)
    with pytest.raises(ValueError, match="needs dst"):
        commlib.isend(torch.ones(1))
    with pytest.raises(ValueError, match="out of range"):
        commlib.recv(torch.ones(1), src=1)
    with pytest.raises(ValueError, match="this rank itself"):
        commlib.send_object_list([1], dst=0)
    with pytest.raises(ValueError, match="non-empty list"):
        commlib.batch_isend_irecv([])
    with pytest.raises(ValueError, match="this rank itself"):
        commlib.batch_isend_irecv([commlib.P2POp(commlib.isend, torch.ones(1), 0)])


def test_p2p_op_names_its_kind():
    assert commlib.P2POp(commlib.isend, torch.ones(1), 1).kind == "send"
    assert commlib.P2POp(dist.irecv, torch.ones(1), 1).kind == "recv"
    with pytest.raises(ValueError, match="isend or irecv"):
        commlib.p2p.p2p_kind(print)


@pytest.mark.parametrize(
    "out_rows, in_rows, out_splits, in_splits, match",
    [
        (2, 2, [1, 1], None, "needs 1 entries"),
        (2, 2, None, [3], "sum to 3"),
        (2, 2, [-1], None, "negative"),
        (3, 2, None, None, "sends itself 2 rows"),
        (2, 2, ["2"], None, "list of ints"),
    ],
)
def test_all_to_all_single_split_checks(out_rows, in_rows, out_splits, in_splits, match):
    with pytest.raises((ValueError, TypeError), match=match):
        commlib.all_to_all_single(
            torch.empty(out_rows), torch.ones(in_rows), out_splits, in_splits
        )


def test_list_checks_on_src():
    with pytest.raises(ValueError, match="needs 1 tensors"):
        commlib.scatter(torch.empty(1), [torch.ones(1)] * 2)
    with pytest.raises(TypeError, match="list of 1 tensors"):
        commlib.scatter(torch.empty(1))
    with pytest.raises(ValueError, match="shaped and typed like"):
        commlib.scatter(torch.empty(1), [torch.ones(2)])
    with pytest.raises(TypeError, match="one dtype"):
        commlib.all_to_all([torch.empty(1)], [torch.ones(1, dtype=torch.int64)])
    with pytest.raises(ValueError, match="one object per rank"):
        commlib.scatter_object_list([None], [1, 2])
    with pytest.raises(TypeError, match="non-empty output list"):
        commlib.scatter_object_list(None, [1])


def test_a_handle_s_future_carries_the_collective_s_error():
    import threading

    from commlib.errors import CommTimeoutError
    from commlib.handle import Handle

    def times_out(timeout):
        raise CommTimeoutError("all_reduce did not complete within 1s")

    x = torch.ones(2)
    handle = Handle(times_out, None, object(), value=[x])
    ended = threading.Event()
    handle.is_completed = ended.is_set  # pending: a thread looks for its end
    threading.Timer(0.1, ended.set).start()
    with pytest.raises(CommTimeoutError, match="did not complete"):
        handle.get_future().wait()
    done = Communicator().all_reduce(x, async_op=True)
    assert done.get_future().wait() == [x] and done.get_future().value()[0] is x


def test_a_wait_keeps_its_timeout_while_a_future_looks_for_the_end():
    import threading
    import time

    from commlib.errors import CommTimeoutError
    from commlib.handle import Handle

    ended = threading.Event()

    def waits(timeout):
        if not ended.wait(None if timeout is None else timeout.total_seconds()):
            raise CommTimeoutError("did not complete")

    x = torch.ones(2)
    handle = Handle(waits, None, object(), value=[x])
    handle.is_completed = ended.is_set
    future = handle.get_future()
    threading.Timer(5, ended.set).start()  # a future holding the wait would hold it this long
    started = time.monotonic()
    with pytest.raises(CommTimeoutError):
        handle.wait(timeout=0.2)
    assert time.monotonic() - started < 2
    ended.set()
    assert future.wait() == [x]
