# pybk-spark: the two commands are `make demo` and `make test`.
PY        ?= python3
VENV      ?= .venv
VPY       := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(VPY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(VPY))
export SPARK_LOCAL_IP := 127.0.0.1
# grpc/grpc#43055: fork+exec children of a gRPC process can fail; see pybk_spark/__init__.py
export GRPC_ENABLE_FORK_SUPPORT := false
export PATH := $(abspath $(VENV))/bin:$(PATH)

.PHONY: venv demo demo-cluster test test-fast test-hosts lint install-check proto proto-check bench bench-peers fault-tools chaos standalone clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev,bench,fastcrc,connect,tls]' --config-settings editable_mode=compat
	touch $(STAMP)

demo: venv
	$(VPY) -m pybk_spark.commands.demo

# The demo on many hosts (network namespaces; needs root, etcd, java): 3 etcd
# members, 5 bookies on 2 racks, a Spark master + 2 workers; a bookie and the
# etcd leader are killed while the job writes.  FAILS naming what is missing.
demo-cluster: venv
	$(VPY) -m pybk_spark.commands.demo_cluster

# lint and install-check run first so pytest's summary stays the last line CI reads
test: venv bench-peers fault-tools lint install-check
	$(VPY) -m pytest -q -m "not long" tests $(PYTEST_ARGS)

# Tests on separate test hosts (network namespaces; docs/testing.md).  Where
# namespaces cannot be made they FAIL here, naming what is missing, instead of
# skipping as they do under `make test`.
test-hosts: venv fault-tools
	$(VPY) -m pybk_spark.cluster.hosts --check
	PYBK_REQUIRE_HOSTS=1 $(VPY) -m pytest -q tests/hosts $(PYTEST_ARGS)

# ruff (style, bugbear, broad excepts) and mypy (strict for protocol/, wire/,
# ledger/ and bookie_server/; Optional tracked everywhere); the settings are in
# pyproject.toml
lint: venv
	$(VENV)/bin/ruff check .
	$(VPY) -m mypy

# the wheel, installed (not editable) into a clean venv outside the repo, runs:
# console scripts + a client round trip on a cluster started from it (docs/testing.md)
install-check:
	$(PY) tests/install/check.py

test-fast: venv
	$(VPY) -m pytest -q -m "not slow and not long" tests $(PYTEST_ARGS)

proto: venv
	$(VPY) -m pybk_spark.wire.build

proto-check: venv
	$(VPY) -m pybk_spark.wire.build --check

standalone: venv
	$(VENV)/bin/pybk standalone --data-dir $(or $(DATA_DIR),./data)

# The benchmark's peer (Redis Streams, appendfsync always) comes from Debian.
bench-peers:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (benchmark peer) with apt-get"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server) >/dev/null \
	  || echo "WARNING: could not install redis-server; Redis figures will be skipped"; }

# iptables: the link faults between test hosts (partitions, drops, loss;
# pybk_spark/cluster/link_faults.py).  Without it those tests skip naming it.
fault-tools:
	@command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || { \
	  echo "installing iptables (link faults between test hosts) with apt-get"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iptables) >/dev/null \
	  || echo "WARNING: could not install iptables; link-fault tests will be skipped"; }

bench: venv bench-peers
	$(VPY) -m bench.run $(if $(QUICK),--quick,)

chaos: venv fault-tools
	$(VPY) -m tests.chaos.runner --duration $(or $(DURATION),120) $(if $(SEED),--seed $(SEED),) \
	  $(if $(FAULTS),--faults $(FAULTS),) $(if $(TOPOLOGY),--topology $(TOPOLOGY),) $(if $(JSON),--json $(JSON),) \
	  $(if $(SPARK),--spark,) $(CHAOS_ARGS)
	$(VPY) -m pytest -q -m long tests $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
