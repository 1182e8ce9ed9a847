"""The job's records, one module per kind: its dataclass, its writer, its reader.

* ``done`` - ``state/done/<shard>.json``: a verified output, first publication wins
* ``failed`` - ``state/failed/<shard>.json``: a terminal failure after the retry budget
* ``retry`` - ``state/retry/<shard>.json``: attempts up to here no longer count
* ``attempt`` - ``attempts/<shard>/<attempt>/attempt.json``: one attempt's progress and outcome

Every reader of a record goes through its module, so a record is checked the
same way wherever it is read. The JSON on disk is the records' dataclass
fields, sorted and indented (``storage.files.dumps_json``).
"""
