"""The host-by-host report of ``make demo-cluster`` (pybk_spark.commands.demo_timeline)
and the launcher's pure helpers; the run itself needs test hosts and JVMs."""
from __future__ import annotations

from pybk_spark.commands import demo_cluster
from pybk_spark.commands.demo_timeline import Timeline


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_timeline_host_by_host_then_in_time_order():
    clock = FakeClock()
    tl = Timeline(clock)
    tl.add_host("etcd-1", "10.213.7.2", "etcd member")
    tl.add_host("bookie-1", "10.213.7.5", "bookie /rack-a")
    tl.event("etcd-1", "started")
    clock.now = 102.5
    tl.event("bookie-1", "SIGKILL bookie-server")
    clock.now = 103.0
    assert tl.event("etcd-1", "SIGKILL etcd (it was the leader)") == 3.0
    tl.figure("bookie-1", "entries acked", 1234)
    out = tl.format().splitlines()
    assert out == [
        "hosts:",
        "  etcd-1    10.213.7.2  etcd member",
        "              +    0.0s  started",
        "              +    3.0s  SIGKILL etcd (it was the leader)",
        "  bookie-1  10.213.7.5  bookie /rack-a  [entries acked=1234]",
        "              +    2.5s  SIGKILL bookie-server",
        "timeline:",
        "  +    0.0s  etcd-1    started",
        "  +    2.5s  bookie-1  SIGKILL bookie-server",
        "  +    3.0s  etcd-1    SIGKILL etcd (it was the leader)",
    ]


def test_chronological_keeps_ties_in_host_order():
    clock = FakeClock()
    tl = Timeline(clock)
    tl.add_host("a", "x", "r")
    tl.add_host("b", "y", "r")
    tl.event("b", "first b")
    tl.event("a", "first a")
    assert [h for _, h, _ in tl.chronological()] == ["a", "b"]


def test_racks_span_two_racks_and_job_args_parse():
    assert set(demo_cluster.RACKS.values()) == {"/rack-a", "/rack-b"}
    assert len(demo_cluster.RACKS) == 5
    assert demo_cluster._rack_summary() == "/rack-a: 1+3+5, /rack-b: 2+4"
    assert demo_cluster._arg(["--ledgers", "4"], "--ledgers", 3) == "4"
    assert demo_cluster._arg([], "--entries", 1000) == "1000"


def test_fails_naming_what_is_missing(monkeypatch, capsys):
    """Where test hosts cannot be made, `make demo-cluster` fails (exit 2) with
    the reason on one line; it never passes quietly."""
    from pybk_spark.cluster import hosts
    monkeypatch.setattr(hosts, "unavailable_reason",
                        lambda: "no CAP_NET_ADMIN: run as root to make network namespaces")
    assert demo_cluster.main([]) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert out == ["demo-cluster: FAILED: cannot run here: test hosts unavailable: "
                   "no CAP_NET_ADMIN: run as root to make network namespaces"]


def test_replacements_include_one_made_in_place_before_any_entry():
    """An ensemble that had no entry yet is replaced in place (same first
    entry): the launcher compares it with what it saw at the kill."""
    from types import SimpleNamespace
    demo = demo_cluster.Demo.__new__(demo_cluster.Demo)
    demo.tl = Timeline(FakeClock())
    for b in demo_cluster.RACKS:
        demo.tl.add_host(b, "x", "bookie")
    demo.seen = (1, 0, ("bookie-4", "bookie-3", "bookie-2"))
    md = SimpleNamespace(ensembles=((0, ("bookie-1", "bookie-3", "bookie-2")),
                                    (700, ("bookie-1", "bookie-5", "bookie-2"))))
    demo._note_replacements(1, md)
    events = {b: [t for _, t in h.events] for b, h in demo.tl.hosts.items() if h.events}
    note = " (seen in the ledger's metadata after the job)"
    assert events == {"bookie-4": ["replaced by bookie-1 in ledger 1 from entry 0" + note],
                      "bookie-3": ["replaced by bookie-5 in ledger 1 from entry 700" + note]}
    demo._note_replacements(2, md)          # another ledger: not compared with the kill's view
    assert len(demo.tl.hosts["bookie-4"].events) == 1
