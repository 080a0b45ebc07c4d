"""Namespaces with another library's names and meanings, for code written against it.

* :mod:`commlib.compat.vis4d`: the 17 names of ``vis4d.common.distributed``
  (``import commlib.compat.vis4d as dist``), with vis4d's meaning where it
  differs from commlib's own (``broadcast`` of an object, ``all_reduce_dict``
  returning the dict).

Examples:
    >>> import commlib.compat.vis4d as dist
    >>> dist.broadcast({"epoch": 3})
    {'epoch': 3}
"""
