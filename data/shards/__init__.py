"""Indexed tar shards: `read.py` opens and checks them, `write.py` packs a dataset into them, and `__main__.py` is
their command line, `python -m data.shards`."""
