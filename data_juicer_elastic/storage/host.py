"""Who this process is, as other nodes see it in the shared directory.

The one host name of the package: in leases and done records, in elections,
and in temp file names (whose owner's pid is judged alive on this host only).
"""

from __future__ import annotations

import os
import socket

HOSTNAME_ENV = "DJ_ELASTIC_HOSTNAME"


def hostname() -> str:
    """The node name recorded in leases, done records and temp file names.

    ``DJ_ELASTIC_HOSTNAME`` overrides it, so one machine can play several
    nodes in simulations and tests.
    """
    return os.environ.get(HOSTNAME_ENV) or socket.gethostname()
