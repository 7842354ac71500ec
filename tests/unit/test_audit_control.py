"""Autorecovery switches (metadata/audit_control.py) on the in-memory twin, and
the daemon's wait between rounds cut short by ``triggeraudit`` (injected
clock and wait: no sleeping)."""
import pytest

from pybk_spark import errors
from pybk_spark.metadata import audit_control as ctl
from pybk_spark.admin.operations.autorecovery import AutoRecovery, AutoRecoveryConfig


def test_defaults_then_cas_created_and_merged(memory_store):
    assert ctl.read_config(memory_store) == {"enabled": True,
                                             "lost_bookie_recovery_delay_s": None}
    assert ctl.set_enabled(memory_store, False)["enabled"] is False
    conf = ctl.set_lost_bookie_delay(memory_store, 30)
    assert conf == {"enabled": False, "lost_bookie_recovery_delay_s": 30}   # merged, kept
    assert ctl.set_lost_bookie_delay(memory_store, None)["lost_bookie_recovery_delay_s"] is None
    with pytest.raises(errors.IncorrectParameter):
        ctl.set_lost_bookie_delay(memory_store, -1)


def test_trigger_bumps_the_version_and_status_reports_it(memory_store):
    assert ctl.trigger_version(memory_store) == 0
    v1 = ctl.trigger(memory_store, 100.0, "me")
    v2 = ctl.trigger(memory_store, 101.0, "me")
    assert 0 < v1 < v2 == ctl.trigger_version(memory_store)
    st = ctl.status(memory_store)
    assert st["last_trigger"] == {"requested_at": 101.0, "by": "me", "count": 2}
    assert st["leader"] is None and st["enabled"] is True and st["missing_bookies"] == {}


class _Bk:
    def __init__(self, store):
        self.metadata_store = store


def test_wait_between_rounds_ends_on_a_trigger(memory_store):
    now = [0.0]
    waits = []

    def wait(t):
        waits.append(t)
        now[0] += t
        if len(waits) == 3:
            ctl.trigger(memory_store, now[0], "test")
        return False

    ar = AutoRecovery(_Bk(memory_store), "unused", AutoRecoveryConfig(interval_s=60,
                      trigger_poll_s=1.0), clock=lambda: now[0])
    ar._trigger_seen = ctl.trigger_version(memory_store)      # as after a leader's round
    assert ar._wait_round(wait) is False
    assert waits == [1.0, 1.0, 1.0] and now[0] == 3.0          # not 60 s


def test_wait_between_rounds_full_interval_and_stop(memory_store):
    now = [0.0]

    def wait(t):
        now[0] += t
        return False
    ar = AutoRecovery(_Bk(memory_store), "unused", AutoRecoveryConfig(interval_s=5,
                      trigger_poll_s=2.0), clock=lambda: now[0])
    ar._trigger_seen = None              # a standby ignores triggers: waits the interval
    ctl.trigger(memory_store, 0.0, "x")
    assert ar._wait_round(wait) is False and now[0] == 5.0
    assert ar._wait_round(lambda t: True) is True                # stop requested
