"""Op counting: rows in and out of every op of one attempt, and the rows op errors removed.

* :mod:`.hooks` - what an op's own batch calls count (Data-Juicer's methods are
  wrapped by patches/data_juicer.py, Ray's ``map_batches`` by patches/ray.py);
* :mod:`.tally` - where they count: per-process memory-mapped counters of the attempt;
* :mod:`.collect` - the sum, per op, into the attempt's ``ops.json``.
"""
