"""commlib's built-in backend plugins, one module each.

Each module registers itself through the ``commlib.backends`` entry-point group
and the ``commlib_backends`` hook, exactly as a third-party plugin would. All
device knowledge of commlib lives here.
"""
