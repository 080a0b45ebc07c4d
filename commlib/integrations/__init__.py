"""Adapters that put commlib under the frameworks users already run.

One module per client library, each importing its client only when one of its
functions or classes is used (commlib itself depends on none of them):

* :mod:`commlib.integrations.lightning`: ``CommlibCollective``, Lightning
  Fabric's ``Collective`` over a commlib :class:`~commlib.Communicator`;
* :mod:`commlib.integrations.torchmetrics`: ``gather_all_tensors``, a
  ``dist_sync_fn`` on commlib's uneven ``all_gather``, and ``use_commlib`` to
  give it to a metric or a collection;
* :mod:`commlib.integrations.mmengine`: ``patch()`` / ``unpatch()`` /
  ``patched()``, routing ``mmengine.dist`` and every mmengine module's imported
  reference to it to commlib;
* :mod:`commlib.integrations.ignite`: ``CommlibModel``, PyTorch-Ignite's
  computation model over a commlib Communicator, and ``use_commlib()`` to make
  it ``ignite.distributed``'s.

Install the clients with ``pip install 'commlib[integrations]'``.

Examples:
    >>> import commlib.integrations.torchmetrics   # no torchmetrics import yet
    >>> from commlib.integrations.mmengine import patched
    >>> with patched():                            # needs mmengine  # doctest: +SKIP
    ...     runner.val()
"""
