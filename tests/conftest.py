"""Fixtures every test module may take by name: ``rgw_env``, one Ceph RGW for the session (tests/rgw.py)."""

from tests.rgw import rgw_env  # noqa: F401 (a fixture: one definition here, so one server a session)
