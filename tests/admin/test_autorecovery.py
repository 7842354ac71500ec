"""``pybk autorecovery``: leader election and a repair round against a
private 4-bookie cluster (a bookie is SIGKILLed)."""

import os
import signal

from pybk_spark.admin.operations.autorecovery import AutoRecovery, AutoRecoveryConfig

from admin_helpers import pybk, registered, wait_until


def test_one_leader_at_a_time(own_cluster, bk):
    conf = AutoRecoveryConfig(leader_ttl_s=5)
    a = AutoRecovery(bk, own_cluster.metadata_uri, conf, identity="a")
    b = AutoRecovery(bk, own_cluster.metadata_uri, conf, identity="b")
    try:
        assert a.is_leader() and a.is_leader()        # taken, then kept
        assert not b.is_leader()
        assert b.run_round()["leader"] is False
        a.resign()
        assert b.is_leader() and not a.is_leader()
    finally:
        a.resign()
        b.resign()


def test_round_rereplicates_a_lost_bookie(own_cluster, bk):
    uri = own_cluster.metadata_uri
    lh = bk.create_ledger(3, 2, 2)
    lh.add_entries(b"auto-%d" % i for i in range(500))
    lh.close()
    victim = sorted(lh.metadata.all_bookies())[0]
    own_cluster.kill_bookie(victim)
    wait_until(lambda: not registered(bk.metadata_store, victim), 60, f"{victim} unregistered")
    res = pybk("--json", "autorecovery", "--metadata-uri", uri, "--rounds", "1",
               "--interval", "0")
    assert res.rc == 0, res.out + res.err
    row = res.json()
    assert row["leader"] and victim in row["lost"] and row["fragments_copied"] >= 1
    md = bk.get_ledger_metadata(lh.ledger_id)
    assert victim not in md.all_bookies()
    rh = bk.open_ledger(lh.ledger_id, recovery=False)
    assert [e.payload for e in rh.read(0, 499)] == [b"auto-%d" % i for i in range(500)]
    # the round released the leadership: the next daemon can lead at once
    again = pybk("--json", "autorecovery", "--metadata-uri", uri, "--rounds", "1",
                 "--verify-every", "1")
    assert again.rc == 0, again.out + again.err
    row = again.json()
    assert row["leader"] and row["fragments_copied"] == 0 and row["under_replicated"] == 0
    assert row["failed_by_reason"] == {}
    text = pybk("autorecovery", "--metadata-uri", uri, "--rounds", "1")
    assert text.rc == 0 and " copied=0 failed=0 fenced=0 " in text.out, text.out + text.err


def test_a_round_line_names_why_copies_failed():
    from pybk_spark.admin.commands.shell_recovery import _reasons
    assert _reasons({"NotEnoughBookies": 2, "ReadError": 1}) == " (NotEnoughBookies=2,ReadError=1)"
    assert _reasons({}) == _reasons(None) == ""


def test_a_round_applies_log_retention_to_idle_logs(own_cluster, bk):
    """A log nobody writes to any more still loses its expired segments: the
    auditor's round applies every log's retention."""
    from pybk_spark.logs.log import read_log
    from pybk_spark.logs.log_writer import LogWriter
    from pybk_spark.logs.truncation import set_log_retention
    w = LogWriter(bk, "idle-retained", wall_clock=lambda: 1_000.0).open()
    for payload in (b"a", b"b", b"c"):
        w.append(payload)
        w.roll()
    w.close()
    set_log_retention(bk.metadata_store, "idle-retained", ms=3_600_000)
    before = read_log(bk.metadata_store, "idle-retained")[0].ledger_ids
    auto = AutoRecovery(bk, own_cluster.metadata_uri, AutoRecoveryConfig(),
                        identity="ret", wall_clock=lambda: 1_000.0 + 1_800)
    try:
        row = auto.run_round()                  # half an hour later: nothing expired
        assert row["retention_dropped_ledgers"] == 0 and row["retention_failed"] == 0
        auto.wall_clock = lambda: 1_000.0 + 7_200
        row = auto.run_round()                  # two hours later: all but the newest
        assert row["retention_dropped_ledgers"] == len(before) - 1
    finally:
        auto.resign()
    md, _ = read_log(bk.metadata_store, "idle-retained")
    assert md.ledger_ids == before[-1:] and not set(before[:-1]) & set(bk.list_ledgers())


def test_a_round_applies_the_offload_policy_and_counts_it(own_cluster, bk, tmp_path):
    """With offload settings, each round offloads what the policy picks from
    every log and, once the grace period is over, deletes the ledgers; the
    row and the Prometheus metrics count it, failures too."""
    from pybk_spark.logs.log import read_log
    from pybk_spark.logs.log_writer import LogWriter, RollPolicy
    from pybk_spark.logs.offload_conf import load_offload_conf
    with LogWriter(bk, "auto-offloaded", roll_policy=RollPolicy(max_entries=10)).open() as w:
        for k in range(4):
            w.append_batch([b"e%03d" % (k * 10 + i) for i in range(10)])
    settings = load_offload_conf(location=str(tmp_path / "off"), grace_s=3600)
    auto = AutoRecovery(bk, own_cluster.metadata_uri, AutoRecoveryConfig(offload=settings),
                        identity="off", wall_clock=lambda: 5_000.0)
    sample = auto.offload_metrics.registry.get_sample_value
    try:
        row = auto.run_round()
        assert (row["offload_segments"], row["offload_ledgers_deleted"]) == (2, 0)
        assert row["offload_bytes"] > 0 and row["offload_failed"] == 0
        md = read_log(bk.metadata_store, "auto-offloaded")[0]
        offloaded = [s.ledger_id for s in md.segments if s.offload is not None]
        assert offloaded == list(md.ledger_ids[:2])
        assert set(offloaded) <= set(bk.list_ledgers())           # within the grace period
        auto.wall_clock = lambda: 5_000.0 + 3_600
        row = auto.run_round()
        assert (row["offload_segments"], row["offload_ledgers_deleted"]) == (0, 2)
        assert not set(offloaded) & set(bk.list_ledgers())
        assert sample("pybk_offload_segments_total") == 2
        assert sample("pybk_offload_bytes_total") == row["offload_bytes"] + sum(
            s.offload.size for s in md.segments if s.offload is not None)
        assert sample("pybk_offload_ledgers_deleted_total") == 2
        assert sample("pybk_offload_last_run_timestamp_seconds") == 8_600.0
        assert sample("pybk_offload_lag_segments") == row["offload_lag_segments"] == 0
        with LogWriter(bk, "auto-unwritable", roll_policy=RollPolicy(max_entries=1)).open() as w:
            for payload in (b"a", b"b", b"c"):
                w.append_batch([payload])
        blocker = tmp_path / "a-file"
        blocker.write_bytes(b"")
        auto.conf.offload = load_offload_conf(location=str(blocker / "off"))
        row = auto.run_round()                  # a location that cannot be written
        assert row["offload_failed"] >= 1 and row["status"] == 0
        assert sample("pybk_offload_failures_total") == row["offload_failed"]
        assert sample("pybk_offload_lag_segments") == row["offload_lag_segments"] >= 1
    finally:
        auto.resign()


def test_leadership_outlives_an_etcd_outage_shorter_than_its_lease(own_cluster, bk):
    """etcd answers nothing for a while (SIGSTOP: every RPC hangs until its
    timeout), less than the leader's lease ttl.  The leader skips that
    round, keeps its lease, and leads again once etcd is back; no other
    process takes over meanwhile.  Before: the leader dropped its lease
    object without revoking it, asked for a new one, found the key still
    held (by the old lease, which its keep-alive thread kept alive) and
    stood by behind its own key for good, and so did everyone else."""
    conf = AutoRecoveryConfig(leader_ttl_s=20)      # keep-alive bound: ttl / 3
    a = AutoRecovery(bk, own_cluster.metadata_uri, conf, identity="a")
    b = AutoRecovery(bk, own_cluster.metadata_uri, conf, identity="b")
    try:
        assert a.is_leader()
        os.kill(own_cluster.etcd.proc.pid, signal.SIGSTOP)
        try:
            assert not a.is_leader()            # unknown: not leading this round
        finally:
            os.kill(own_cluster.etcd.proc.pid, signal.SIGCONT)
        assert not b.is_leader()                # a's lease is alive: no second leader
        assert a.is_leader() and a.is_leader()  # a leads again, at once
        a.resign()
        assert b.is_leader() and not a.is_leader()
    finally:
        a.resign()
        b.resign()
        own_cluster.heal()      # bookies whose leases ended while etcd stood still


def test_a_round_prefers_a_logs_own_offload_policy(own_cluster, bk, tmp_path):
    """A log that records its own policy is offloaded by it; the others by
    the settings' policy (here: nothing is old enough)."""
    from pybk_spark.logs.log import read_log
    from pybk_spark.logs.log_writer import LogWriter, RollPolicy
    from pybk_spark.logs.offload import set_offload_policy
    from pybk_spark.logs.offload_conf import load_offload_conf
    for name in ("own-policy", "conf-policy"):
        with LogWriter(bk, name, roll_policy=RollPolicy(max_entries=5)).open() as w:
            for k in range(4):
                w.append_batch([b"e%03d" % (k * 5 + i) for i in range(5)])
    set_offload_policy(bk, "own-policy", keep_segments=3)
    settings = load_offload_conf(location=str(tmp_path / "off"), min_age_s=3600, grace_s=3600)
    auto = AutoRecovery(bk, own_cluster.metadata_uri, AutoRecoveryConfig(offload=settings),
                        identity="own", wall_clock=lambda: 5_000.0)
    try:
        auto.run_round()
    finally:
        auto.resign()
    own = read_log(bk.metadata_store, "own-policy")[0]
    assert [s.offload is not None for s in own.segments] == [True, False, False, False]
    conf = read_log(bk.metadata_store, "conf-policy")[0]
    assert not any(s.offload is not None for s in conf.segments)
