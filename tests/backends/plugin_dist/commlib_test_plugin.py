"""A third-party commlib plugin used by the tests: two backends, one unavailable."""

from commlib import Backend, hookimpl


class CountingGloo(Backend):
    """gloo, counting the all_reduce calls it serves."""

    name = "counting-gloo"
    torch_backend = "gloo"
    calls = 0

    def all_reduce(self, tensor, op, group, async_op=False):
        type(self).calls += 1
        return super().all_reduce(tensor, op, group, async_op)


class Frobnicator(Backend):
    name = "frob"
    torch_backend = "frob"
    device_type = "frob"

    def unavailable_reason(self):
        return "the frobnicator is not plugged in"


@hookimpl
def commlib_backends():
    return [CountingGloo, Frobnicator]
