"""The public API: the Communicator, the module-level functions and helpers, on single and gloo."""
