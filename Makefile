# Developer entry points. `make test` is what CI runs (.ci/run).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.stamp
SYSDEPS := iproute2 nftables iperf3 tshark

.PHONY: venv install sysdeps test lint demo bench

venv: $(STAMP)

# Re-install whenever pyproject.toml is newer than the stamp.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,dev]'
	touch $(STAMP)

# mrc/wire, mrc/core and mrc/io compiled in place with mypyc (tools/build_mypyc.py): rebuilt whenever a
# source changed, skipped with one line without a C compiler, pure Python on any failure.
.PHONY: compiled
compiled: venv
	@$(PY) tools/build_mypyc.py

install: venv compiled

# Debian packages the testbed and comparisons use; only as root with apt-get, else skipped.
sysdeps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		missing=""; \
		for p in $(SYSDEPS); do \
			dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" \
				|| missing="$$missing $$p"; \
		done; \
		if [ -n "$$missing" ]; then \
			echo "sysdeps: installing$$missing"; \
			echo "wireshark-common wireshark-common/install-setuid boolean false" \
				| debconf-set-selections 2>/dev/null || true; \
			export DEBIAN_FRONTEND=noninteractive; \
			{ apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; } \
				>/dev/null 2>&1 || echo "sysdeps: could not install$$missing (continuing)" >&2; \
		fi; \
	fi

test: sysdeps install
	$(PY) -m pytest -q

# The same suite on the pure-Python modules (MRC_PURE=1 ignores the compiled ones).
.PHONY: test-pure
test-pure: sysdeps venv
	MRC_PURE=1 $(PY) -m pytest -q

# The same suite with per-packet spraying (flowcell 1) wherever the bench would batch.
.PHONY: test-flowcell1
test-flowcell1: sysdeps install
	MRC_FLOWCELL=1 $(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check mrc tests tools
	$(VENV)/bin/mypy --strict mrc tools

# The demo run, its text report, then its picture: the bench writes a trace (--trace) and
# `mrc plot` draws it (goodput per plane with the fault marked, EV states, windows). It does not
# wait for the mypyc build (minutes on a small machine): its banner line says whether the core
# ran compiled or as pure Python, and that `make install` compiles it.
demo: sysdeps venv
	$(VENV)/bin/mrc bench --demo --trace demo.trace
	@$(VENV)/bin/mrc plot demo.trace -o demo.png

bench: install
	$(VENV)/bin/mrc bench --demo -J > bench.json

# The core alone, two sessions back to back in one process (tools/bench_core.py): CPU µs per
# packet on each side, steadier than a socket run on a busy host. BENCH_CORE_ARGS="-l 4K --imm".
.PHONY: bench-core
bench-core: install
	$(PY) -m tools.bench_core $(BENCH_CORE_ARGS)

# netns/veth testbed tests (need root; they skip cleanly without it), and lint for tools/.
.PHONY: testbed testbed-lint
testbed: sysdeps venv
	$(PY) -m pytest -q tests/testbed

testbed-lint: venv
	$(VENV)/bin/ruff check tools tests/testbed
	$(VENV)/bin/mypy --strict tools/testbed

# mrc side by side with iperf3, MPTCP, aioquic and a raw-UDP ceiling, plus a failover run, on a
# netns testbed (tools/compare; root only). Writes compare.json; COMPARE_ARGS="-n 4G --logs DIR".
.PHONY: compare
compare: sysdeps install
	@$(PY) -c "import aioquic" 2>/dev/null || $(PY) -m pip install -q -e '.[compare]'
	$(PY) -m tools.compare $(COMPARE_ARGS)

# A training job through fabric faults (tools/job; root only): on the clos testbed (SRv6 and
# --ecmp 1) a rank per host runs all-reduce + compute steps over mrc, TCP and MPTCP, fault-free
# and under the MRC paper's schedules. Prints the table, writes job.json (mrc plot job.json);
# JOB_ARGS="--fabric srv6 --size 8M --steps 40" to change the run.
.PHONY: job
job: sysdeps install
	@$(PY) -c "import numpy" 2>/dev/null || $(PY) -m pip install -q -e '.[collective]'
	$(PY) -m tools.job -o job.json $(JOB_ARGS)

# The hostile-input harness (tools/hostile; root only): 1,000,000 hostile datagrams at a live
# verified --security encrypt transfer on loopback, then the hostile local clients of a real
# daemon (other uids on its control socket); prints its figures as JSON.
# HOSTILE_ARGS="--security auth", "--datagrams 100000" or "--family local" to change the run.
.PHONY: hostile
hostile: venv
	@$(PY) -m tools.hostile -J --family all --datagrams 1000000 $(HOSTILE_ARGS)

# Issue 17's figures (tools/htsim, mrc/experiments): not in `make test`. `paper` runs the MRC paper's
# experiments for MRC and a RoCE baseline at the small scale (about a minute), `paper-large`
# at 1,024 hosts x 8 planes (about 14 minutes); `scale` runs the 1,024-host permutation and
# the htsim cross-check (builds htsim from an uet-htsim source tree: HTSIM_ARGS="--htsim-src DIR").
.PHONY: paper paper-large scale
paper: install
	nice -n 10 $(PY) -m mrc.experiments.paper -j 2 --plot paper-plots

paper-large: install
	nice -n 10 $(PY) -m mrc.experiments.paper --scale paper -j 2 --plot paper-plots --json-file paper.json

scale: install
	nice -n 10 $(PY) -m mrc.experiments.permutation
	nice -n 10 $(PY) -m tools.htsim $(HTSIM_ARGS)
