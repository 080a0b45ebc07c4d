"""`commlib bench`, the docs and their examples, the docstring examples, the layering rules."""
