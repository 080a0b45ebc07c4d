"""gloo's checked lanes: a steady checked call goes from the lanes' entry to its prepared round.

As mpi's (tests/backends/test_mpi.py), on the session's gloo worlds: the
results are the whole way's, a steady call takes one round where its data
rides and two where it does not (the engine's collective follows), a rank
changing its arguments after steady calls makes every rank raise the same
error and the next call is right, and a rank that stays away is a timeout.
"""

from __future__ import annotations

import time

import pytest
import torch

from commlib import Communicator, _shared_rows
from commlib.errors import CommTimeoutError, RemoteArgumentError

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _int_or_float(n: int, value: int, dtype: torch.dtype) -> torch.Tensor:
    # a last element that shows a reduction order or a lost high word
    x = torch.full((n,), value, dtype=dtype)
    x[-1] = 2**40 + value if dtype is torch.int64 else 0.1 * value
    return x


def _rounds(engine, call, *args) -> int:
    # the engine numbers each call it makes: the rounds ``call`` took
    before = engine.seq
    call(*args)
    return engine.seq - before


def _steady_results_and_rounds(comm) -> list[str]:
    world, rank = comm.world_size, comm.rank
    engine = comm._engine
    riding = comm._lanes.riding
    if riding is None:
        return ["no checked lanes on gloo"]
    wrong = []
    # 256 and 2048 elements ride once the slot learnt them (from all_reduce: 100_000 too)
    for n in (256, 2048, 100_000):
        for dtype in (torch.float32, torch.int64):
            want = _int_or_float(n, 1, dtype)
            for r in range(1, world):  # rank order, as every rank reduces the parts
                want = want + _int_or_float(n, r + 1, dtype)
            for call in range(4):  # the first calls prepare (and teach) the round
                steady = call == 3
                counted = {}

                x = _int_or_float(n, rank + 1, dtype)
                counted["all_reduce"] = _rounds(engine, comm.all_reduce, x)
                if not torch.equal(x, want):
                    wrong.append(f"all_reduce {n} {dtype}: {x[-2:]} != {want[-2:]}")
                for dst in sorted({0, world - 1}):
                    z = _int_or_float(n, rank + 1, dtype)
                    mine = z.clone()
                    counted[f"reduce to {dst}"] = _rounds(engine, comm.reduce, z, dst)
                    if not torch.equal(z, want if rank == dst else mine):
                        wrong.append(f"reduce {n} {dtype} to {dst}: {z[-2:]}")
                for src in sorted({0, world - 1}):
                    y = torch.full((n,), rank, dtype=dtype)
                    counted[f"broadcast from {src}"] = _rounds(engine, comm.broadcast, y, src)
                    if not torch.equal(y, torch.full((n,), src, dtype=dtype)):
                        wrong.append(f"broadcast {n} {dtype} from {src}: {y[:2]}")
                out = torch.empty(world * n, dtype=dtype)
                mine = torch.full((n,), rank, dtype=dtype)
                counted["all_gather"] = _rounds(engine, comm.all_gather_into_tensor, out, mine)
                if out.view(world, n)[:, -1].tolist() != list(range(world)):
                    wrong.append(f"all_gather_into_tensor {n}: {out.view(world, n)[:, -1]}")
                got = torch.empty(n, dtype=dtype)
                whole = torch.arange(world * n, dtype=dtype) * (rank + 1)
                counted["reduce_scatter"] = _rounds(engine, comm.reduce_scatter, got, whole)
                right = (torch.arange(n, dtype=dtype) + rank * n) * (world * (world + 1) // 2)
                if not torch.equal(got, right):
                    wrong.append(f"reduce_scatter {n} {dtype}: {got[-2:]} != {right[-2:]}")
                piece = torch.zeros(n, dtype=dtype)
                sent = [torch.full((n,), 10 * j + 1, dtype=dtype) for j in range(world)]
                root = world - 1
                ins = sent if rank == root else None
                counted["scatter"] = _rounds(engine, comm.scatter, piece, ins, root)
                if not torch.equal(piece, torch.full((n,), 10 * rank + 1, dtype=dtype)):
                    wrong.append(f"scatter {n} {dtype}: {piece[:2]}")
                if steady and n <= 2048:  # the data rides: one round each
                    more = {k: v for k, v in counted.items() if v != 1}
                    if more:
                        wrong.append(f"steady {n} {dtype}: rounds {more}")
                elif steady:  # (the slot learnt them from all_reduce: they ride too)
                    if any(v > 2 for v in counted.values()):
                        wrong.append(f"steady {n} {dtype}: rounds {counted}")
            # the entry itself serves each steady call (True: it ran the call)
            x = _int_or_float(n, rank + 1, dtype)
            if not riding.all_reduce(x, "sum") or not torch.equal(x, want):
                wrong.append(f"the entry did not serve all_reduce {n} {dtype}")
            y = torch.full((n,), rank, dtype=dtype)
            if not riding.broadcast(y, world - 1) or y[0] != world - 1 or y[-1] != world - 1:
                wrong.append(f"the entry did not serve broadcast {n} {dtype}")
            z = _int_or_float(n, rank + 1, dtype)
            mine = z.clone()
            if not riding.reduce(z, world - 1, "sum") or not torch.equal(
                z, want if rank == world - 1 else mine
            ):
                wrong.append(f"the entry did not serve reduce {n} {dtype}")
            out = torch.empty(world * n, dtype=dtype)
            served = riding.all_gather_into_tensor(out, torch.full((n,), rank, dtype=dtype))
            if not served or out.view(world, n)[:, 0].tolist() != list(range(world)):
                wrong.append(f"the entry did not serve all_gather_into_tensor {n} {dtype}")
    return wrong


def test_steady_checked_calls_on_gloo_are_right_in_their_rounds(multi_world):
    assert multi_world.run(_steady_results_and_rounds) == [[]] * multi_world.size


def _lazy_views_in_and_out(comm) -> list[str]:
    # a lazily conjugated complex tensor (x.conj()) and a lazily negated real one
    # (x.conj().imag) hold other values than their bytes: as inputs and as outputs,
    # first call and steady ones, checked and not, the values are what they read
    wrong: list[str] = []
    rank, world = comm.rank, comm.world_size

    def made(r: int, kind: str) -> torch.Tensor:
        base = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64) * (r + 1)
        return base.conj() if kind == "conj" else base.conj().imag

    def blank(n: int, kind: str) -> torch.Tensor:
        if kind == "conj":
            return torch.zeros(n, dtype=torch.complex64).conj()
        return torch.zeros(n, dtype=torch.complex64).conj().imag

    for strict in (True, False):
        c = Communicator(strict=strict)
        for kind in ("conj", "neg"):
            values = [made(r, kind).resolve_conj().resolve_neg() for r in range(world)]
            every = torch.cat(values)
            for call in range(3):
                tag = f"strict={strict} {kind} call {call}"
                out = torch.empty(2 * world, dtype=values[0].dtype)
                if strict or kind == "neg":
                    # (torch's own gloo refuses unresolved conjugates: unchecked, neg only)
                    c.all_gather_into_tensor(out, made(rank, kind))
                    if not torch.equal(out, every):
                        wrong.append(f"{tag}: all_gather_into_tensor of a view")
                    dest = blank(2 * world, kind)
                    c.all_gather_into_tensor(dest, values[rank].clone())
                    if not torch.equal(dest.resolve_conj().resolve_neg(), every):
                        wrong.append(f"{tag}: all_gather_into_tensor into a view")
                    got = blank(2, kind)
                    c.broadcast(made(0, kind) if rank == 0 else got, 0)
                    if rank and not torch.equal(got.resolve_conj().resolve_neg(), values[0]):
                        wrong.append(f"{tag}: broadcast of a view into a view")
                    part = blank(2, kind)
                    c.scatter(part, [made(r, kind) for r in range(world)] if rank == 0 else None)
                    if not torch.equal(part.resolve_conj().resolve_neg(), values[rank]):
                        wrong.append(f"{tag}: scatter of views into a view")
                    summed = made(rank, kind)
                    c.all_reduce(summed)
                    if not torch.equal(summed.resolve_conj().resolve_neg(), sum(values)):
                        wrong.append(f"{tag}: all_reduce in place on a view")
                gathered = c.all_gather(made(rank, kind))
                if not all(torch.equal(g, v) for g, v in zip(gathered, values)):
                    wrong.append(f"{tag}: all_gather of a view")
    return wrong


def test_lazily_conjugated_or_negated_tensors_are_read_and_written_as_their_values(
    multi_world,
):
    assert multi_world.run(_lazy_views_in_and_out) == [[]] * multi_world.size


def _past_the_slot(comm) -> list[str]:
    # a group of its own, whose slot no all_reduce taught: a 400 KB broadcast and reduce
    # stay past what they teach it on the engine (128 KiB), and a 2.4 MB all_reduce and
    # all_to_all_single past what they teach it there (1 MiB over all ranks), so the
    # engine's collective follows the round; where the group's rounds go through shared
    # memory every call rides up to its room (one round), and 4.4 MB stays past it (two)
    c = Communicator().new_group(range(comm.world_size))
    world, rank, engine = c.world_size, c.rank, c._engine
    shared = engine.kept.get("shared")
    wrong = []
    for n in (100_000, 600_000, 1_100_000):
        rides = shared is not None and 4 * n <= _shared_rows.DATA_ROOM
        for call in range(4):
            x = torch.full((n,), float(rank + 1))
            took_all = _rounds(engine, c.all_reduce, x)
            if x[0] != world * (world + 1) // 2 or x[-1] != x[0]:
                wrong.append(f"all_reduce {n} {call}: {x[:2]}")
            part = n // world
            sent = torch.arange(world * part, dtype=torch.float32) + 1000 * rank
            got = torch.empty(world * part)
            took_a2a = _rounds(engine, c.all_to_all_single, got, sent)
            want = torch.cat(
                [torch.arange(rank * part, (rank + 1) * part) + 1000.0 * j for j in range(world)]
            )
            if not torch.equal(got, want):
                wrong.append(f"all_to_all_single {n} {call}")
            if (
                call
                and shared is not None
                and (took_all, took_a2a) != ((1, 1) if rides else (2, 2))
            ):
                wrong.append(f"rounds {n} {call}: {took_all}, {took_a2a} (rides: {rides})")
            y = torch.full((n,), float(rank))
            took = _rounds(engine, c.broadcast, y, world - 1)
            if not torch.equal(y, torch.full((n,), float(world - 1))):
                wrong.append(f"broadcast {n} {call}: {y[:2]}")
            z = torch.full((n,), float(rank + 1))
            took_reduce = _rounds(engine, c.reduce, z, 0)
            if z[0] != (world * (world + 1) // 2 if rank == 0 else rank + 1) or z[-1] != z[0]:
                wrong.append(f"reduce {n} {call}: {z[:2]}")
            if call and (took, took_reduce) != ((1, 1) if rides else (2, 2)):
                wrong.append(f"rounds {n} {call}: {took}, {took_reduce} (rides: {rides})")
        # (the slot shrinks after eight calls that needed less: one more prepares the round)
        c.broadcast(torch.full((n,), float(rank)), world - 1)
        y = torch.full((n,), float(rank))
        if not c._lanes.riding.broadcast(y, world - 1) or y[-1] != world - 1:
            wrong.append(f"the entry did not serve broadcast {n}: {y[-2:]}")
    # an object collective on the slot a 2.4 MB all_reduce taught: right, and through
    # shared memory its first round copies only the bytes it wrote, not the slot
    c.all_reduce(torch.ones(600_000))
    if c.all_gather_object({"rank": rank}) != [{"rank": r} for r in range(world)]:
        wrong.append("all_gather_object after a large all_reduce")
    if shared is not None:
        wrote = shared.words[shared.mine + _shared_rows._USED + (shared.published & 1)]
        if wrote > 4096:
            wrong.append(f"all_gather_object's first round copied {wrote} bytes")
    return wrong


def test_steady_checked_calls_past_the_slot_take_the_engines_collective(multi_world):
    assert multi_world.run(_past_the_slot) == [[]] * multi_world.size


def _steady_or_odd(comm, name: str, n: int, odd: bool) -> None:
    # a steady call of ``name``'s kind, or (``odd``) the same call with that one thing changed
    x = torch.ones(n)
    if name == "shape":
        comm.all_reduce(x.view(2, n // 2) if odd else x)
    elif name == "dtype":
        comm.all_reduce(x.int() if odd else x)
    elif name == "op":
        comm.all_reduce(x, "max" if odd else "sum")
    elif name == "scatter op":
        comm.reduce_scatter(
            torch.empty(n), torch.ones(comm.world_size * n), "max" if odd else "sum"
        )
    elif name == "scatter src":
        src = 1 if odd else 0
        parts = [torch.ones(n)] * comm.world_size if comm.rank == src else None
        comm.scatter(x, parts, src=src)
    elif name == "dst":
        comm.reduce(x, dst=1 if odd else 0)
    elif name == "gather shape":
        out = torch.empty(comm.world_size * n)
        comm.all_gather_into_tensor(out.view(-1, 2) if odd else out, x.view(-1, 2) if odd else x)
    elif name == "src":
        comm.broadcast(x, src=1 if odd else 0)
    else:
        comm.broadcast(x.view(2, n // 2) if odd else x, src=0)


def _a_rank_changes_after_steady_calls(comm) -> list[str]:
    world, rank = comm.world_size, comm.rank
    wrong = []
    # a rank on the whole way (non-contiguous) meets ranks on the entry: they agree
    for _ in range(3):
        comm.all_reduce(torch.full((2, 4), float(rank + 1)))  # steady on every rank
    c = torch.full((4, 2), float(rank + 1)).t() if rank == 0 else torch.full((2, 4), rank + 1.0)
    comm.all_reduce(c)
    if c.tolist() != [[world * (world + 1) / 2] * 4] * 2:
        wrong.append(f"non-contiguous {c}")
    for n in (256, 100_000):
        for name in (
            "shape",
            "dtype",
            "op",
            "src",
            "broadcast shape",
            "dst",
            "gather shape",
            "scatter op",
            "scatter src",
        ):
            for _ in range(3):
                _steady_or_odd(comm, name, n, odd=False)
            try:
                _steady_or_odd(comm, name, n, odd=rank == world - 1)
                wrong.append(f"{name} {n}: no error")
            except ValueError as exc:
                if "ranks passed different arguments" not in str(exc):
                    wrong.append(f"{name} {n}: {exc}")
            x = torch.ones(n)
            comm.all_reduce(x)
            if x[0] != world or x[-1] != world:
                wrong.append(f"after {name} {n}: {x[0]}")
    return wrong


def test_a_rank_changing_its_arguments_after_steady_calls_fails_every_rank_alike(multi_world):
    assert multi_world.run(_a_rank_changes_after_steady_calls) == [[]] * multi_world.size


def _steady_call_times_out(comm) -> tuple[str, float, bool]:
    c = Communicator(timeout=1.0).new_group(range(comm.world_size))
    for _ in range(2):  # the round is prepared (the whole way)
        c.all_reduce(torch.ones(4))
    took = c._lanes.riding is not None and c._lanes.riding.all_reduce(torch.ones(4), "sum")
    if c.rank == 0:
        time.sleep(3)  # past the others' timeout: they wait in the steady round
        return "away", 0.0, took
    start = time.monotonic()
    try:
        c.all_reduce(torch.ones(4))
        outcome = "no error"
    except CommTimeoutError as exc:
        outcome = type(exc).__name__
    return outcome, time.monotonic() - start, took


def test_a_steady_checked_calls_round_times_out_when_a_rank_stays_away(world3):
    results = world3.run(_steady_call_times_out)
    assert results[0] == ("away", 0.0, True), results
    for outcome, waited, took in results[1:]:
        assert (outcome, took) == ("CommTimeoutError", True), results
        assert 0.9 < waited < 15, results


def steady_all_to_all_single(comm) -> list[str]:
    """all_to_all_single's checked lane (gloo's and mpi's): results, rounds, mismatches.

    Even splits, rows of 1 and of 3 elements, small (riding) and past the slot;
    after steady calls a rank passing explicit splits that match goes on with
    every rank, one passing others makes every rank raise the same error, one
    changing its shape too; the next call is right.
    """
    world, rank = comm.world_size, comm.rank
    engine = comm._engine
    riding = comm._lanes.riding
    wrong = []

    def want(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # rank r's chunk for this rank holds r * 1000 + this rank's chunk index
        rows = shape[0] // world
        got = torch.empty(shape, dtype=dtype)
        for r, chunk in enumerate(got.split(rows)):
            chunk.copy_(_sent(r, shape, dtype)[rank * rows : (rank + 1) * rows])
        return got

    for shape in ((world * 64,), (world * 2, 3), (world * 40_000,)):
        for dtype in (torch.float32, torch.int64):
            expected = want(shape, dtype)
            for call in range(4):  # the first calls prepare (and teach) the round
                out = torch.full(shape, -1, dtype=dtype)
                rounds = _rounds(engine, comm.all_to_all_single, out, _sent(rank, shape, dtype))
                if not torch.equal(out, expected):
                    wrong.append(f"{shape} {dtype} call {call}: {out.view(-1)[:4]}")
                if call == 3 and world > 1 and rounds not in (1, 2):
                    wrong.append(f"{shape} {dtype}: {rounds} rounds")
            if riding is not None and world > 1:
                out = torch.full(shape, -1, dtype=dtype)
                if not riding.all_to_all_single(out, _sent(rank, shape, dtype)):
                    wrong.append(f"the entry did not serve {shape} {dtype}")
                elif not torch.equal(out, expected):
                    wrong.append(f"the entry's result {shape} {dtype}: {out.view(-1)[:4]}")
    if world == 1:
        return wrong
    n = world * 64
    even = [64] * world
    # explicit splits that match the even ones, on one rank: every rank goes on with them
    for _ in range(3):
        comm.all_to_all_single(torch.empty(n), _sent(rank, (n,), torch.float32))
    out = torch.empty(n)
    splits = even if rank == world - 1 else None
    comm.all_to_all_single(out, _sent(rank, (n,), torch.float32), splits, splits)
    if not torch.equal(out, want((n,), torch.float32)):
        wrong.append(f"explicit splits on one rank: {out[:4]}")
    # other splits on one rank, or another shape: the same error on every rank
    for odd in ("splits", "shape"):
        for _ in range(3):
            comm.all_to_all_single(torch.empty(n), _sent(rank, (n,), torch.float32))
        last = rank == world - 1
        if odd == "splits":
            other = [64 + 1, *[64] * (world - 2), 64 - 1] if last else None
            wrong += _odd(comm, odd, torch.empty(n), torch.ones(n), other, other)
        else:
            m = n + world if last else n
            wrong += _odd(comm, odd, torch.empty(m), torch.ones(m))
    return wrong


def _odd(comm, odd: str, *args) -> list[str]:
    # an all_to_all(_single) where one rank is odd: the error every rank raised (the same
    # text on every rank), and whether the next all_reduce is right
    got = []
    call = comm.all_to_all if type(args[0]) is list else comm.all_to_all_single
    try:
        call(*args)
        got.append(f"{odd}: no error")
    except RemoteArgumentError as exc:
        got.append(f"{odd} raised: {exc}")
    x = torch.ones(4)
    comm.all_reduce(x)
    if x[0] != comm.world_size:
        got.append(f"after {odd}: {x}")
    return got


def steady_all_to_all(comm) -> list[str]:
    """all_to_all's checked lane (lists of one shape; gloo's and mpi's): results, mismatches.

    Small parts (riding) and past the slot, float and int64; after steady calls a
    rank passing lists of other shapes whose pairs match goes on with every rank,
    one whose pairs do not, or of another shape, makes every rank raise the same
    error; the next call is right.
    """
    world, rank = comm.world_size, comm.rank
    engine = comm._engine
    riding = comm._lanes.riding
    wrong = []

    def ins(n: int, dtype: torch.dtype, me: int = rank) -> list[torch.Tensor]:
        # part j of rank r: r * 1000 + j, its last element + 7 (an order shows)
        parts = [torch.full((n,), me * 1000 + j, dtype=dtype) for j in range(world)]
        for p in parts:
            p[-1] += 7
        return parts

    for n in (16, 300, 50_000):
        for dtype in (torch.float32, torch.int64):
            want = [ins(n, dtype, r)[rank] for r in range(world)]
            for call in range(4):  # the first calls prepare (and teach) the round
                outs = [torch.full((n,), -1, dtype=dtype) for _ in range(world)]
                rounds = _rounds(engine, comm.all_to_all, outs, ins(n, dtype))
                if not all(torch.equal(o, w) for o, w in zip(outs, want)):
                    wrong.append(f"all_to_all {n} {dtype} call {call}: {outs[0][:2]}")
                if call == 3 and world > 1 and rounds not in (1, 2):
                    wrong.append(f"all_to_all {n} {dtype}: {rounds} rounds")
            if riding is not None and world > 1:
                outs = [torch.full((n,), -1, dtype=dtype) for _ in range(world)]
                if not riding.all_to_all(outs, ins(n, dtype)):
                    wrong.append(f"the entry did not serve all_to_all {n} {dtype}")
                elif not all(torch.equal(o, w) for o, w in zip(outs, want)):
                    wrong.append(f"the entry's all_to_all {n} {dtype}: {outs[0][:2]}")
    if world == 1:
        return wrong
    n = 16
    last = rank == world - 1
    # lists of other shapes whose pairs match, on one rank: every rank goes on
    for _ in range(3):
        comm.all_to_all([torch.empty(n) for _ in range(world)], ins(n, torch.float32))
    outs = [torch.empty(n) for _ in range(world)]
    sent = [p.view(2, n // 2) if last else p for p in ins(n, torch.float32)]
    got = [o.view(2, n // 2) if last else o for o in outs]
    comm.all_to_all(got, sent)
    if not all(torch.equal(o, ins(n, torch.float32, r)[rank]) for r, o in enumerate(outs)):
        wrong.append(f"all_to_all, lists of other shapes on one rank: {outs[0][:2]}")
    # pairs that do not match on one rank, or another shape: the same error on every rank
    for odd in ("pairs", "shape"):
        for _ in range(3):
            comm.all_to_all([torch.empty(n) for _ in range(world)], ins(n, torch.float32))
        if odd == "pairs":
            sizes = [n + 1 if j == 0 and last else n for j in range(world)]
        else:
            sizes = [n + 2 if last else n] * world
        wrong += _odd(comm, odd, [torch.empty(m) for m in sizes], [torch.ones(m) for m in sizes])
    return wrong


def _sent(rank: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    # this rank's input: element i of its chunk for rank j is rank * 1000 + j (+ i for floats)
    rows = shape[0]
    got = torch.arange(rows).repeat_interleave(max(1, torch.Size(shape[1:]).numel()))
    return (got.view(shape) % 1000 + rank * 1000).to(dtype)


def raised_alike(results: list[list[str]], first_odd: str = "splits") -> bool:
    """Whether every rank's list is its two errors (``first_odd``, "shape"), alike everywhere."""
    first = results[0]
    return (
        len(first) == 2
        and first[0].startswith(f"{first_odd} raised: ")
        and first[1].startswith("shape raised: ")
        and all(r == first for r in results)
    )


def test_steady_checked_all_to_all_single_on_gloo(world):
    results = world.run(steady_all_to_all_single)
    assert results == [[]] if world.size == 1 else raised_alike(results), results


def test_steady_checked_all_to_all_on_gloo(world):
    results = world.run(steady_all_to_all)
    assert results == [[]] if world.size == 1 else raised_alike(results, "pairs"), results
