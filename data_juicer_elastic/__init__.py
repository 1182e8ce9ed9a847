"""Elastic, shared-directory sharding for Data-Juicer recipes.

The core (storage, jobdir, prepare, claims, worker, merge, status) imports
neither Ray nor Data-Juicer; ``runner``, ``executor`` and ``plugin`` do.
"""

__version__ = "0.1.0"
