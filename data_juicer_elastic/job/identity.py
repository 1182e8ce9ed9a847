"""Who this process is, as other nodes see it in the shared directory."""

from __future__ import annotations

import os
import socket

HOSTNAME_ENV = "DJ_ELASTIC_HOSTNAME"


def hostname() -> str:
    """The node name recorded in leases and done records.

    ``DJ_ELASTIC_HOSTNAME`` overrides it, so one machine can play several
    nodes in simulations and tests.
    """
    return os.environ.get(HOSTNAME_ENV) or socket.gethostname()
