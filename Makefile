# Two commands do everything on a fresh machine: `make demo` (the main job) and `make test`.
# Both create the virtual environment first: CPU torch 2.13.0 before anything that depends on torch,
# so pip never reaches for a CUDA build.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
OUT ?= runs/demo

.PHONY: setup demo test test-fast test-cluster bench lint clean prometheus chromium ssh-tools

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

# The guide's benchmark emulated in virtual time (three designs, six rates, three seeds), then every
# design live on a local Ray with the tiny runner model computing for real (greedy tokens from its
# logits) at the time_scale calibrated for this host.
demo: $(STAMP)
	$(VENV)/bin/testbed sweep --preset guide-l40s --compute skip --seeds 3 --num-requests 100 --out $(OUT)/sweep
	$(VENV)/bin/testbed run --preset guide-l40s --mode live --time-scale auto --compute real \
		--output-policy greedy --rate 0.4 --num-requests 8 --set workload.prompt_len=2048 \
		--set workload.output_len=64 --out $(OUT)/live

# The tests scrape a live run with a real Prometheus and render the report in headless Chromium
# (Debian's packages, installed when missing), and
# `ray up` cluster/ray-up/onprem.yaml over SSH on this host (as root; openssh-server and rsync installed
# when missing): a live job on three nodes, Prometheus, rsync-down, `ray down` leaving nothing.
# Three parts:
# - the `ray up` tests (marked `cluster`: Ray, Prometheus and an SSH server on this host, mostly waiting
#   on them) in the background, their output shown when they end;
# - beside them, on both cores, test-fast's tests and the `full` tests marked `parallel` (static
#   checks, the vLLM peer's scripts, browsers, servers on free ports, replays that time nothing: none
#   starts Ray, Prometheus or sshd, so the `ray up` tests' host-wide state is theirs alone);
# - then the other `full` tests one at a time (live Ray, Prometheus, the vLLM server and the timing
#   checks hold ports or host-wide state, or time their waits).
# All three run; any failing fails. Ctrl-C waits for the `ray up` tests' teardown (`ray down`) and
# shows their output (tests/conftest.py: a background job would otherwise not see Ctrl-C).
# `--dist loadfile`: a module's tests on one core, so that its module-scoped fixtures are built once;
# the modules that run the vLLM peer together (tests/conftest.py).
test: $(STAMP) prometheus chromium ssh-tools
	@log=$$(mktemp /tmp/testbed-ray-up-tests.XXXXXX); echo "the ray up tests run in the background: $$log"; \
	$(PY) -m pytest -p no:cacheprovider -m 'cluster and not slow and not bench' >$$log 2>&1 & ray_up=$$!; \
	trap 'wait $$ray_up; cat $$log; rm -f $$log; exit 130' INT; \
	$(PY) -m pytest -m 'not slow and not bench and (not full or parallel)' -n 2 --dist loadfile; both=$$?; \
	wait $$ray_up; cluster=$$?; trap - INT; cat $$log; rm -f $$log; \
	$(PY) -m pytest -m 'full and not parallel and not cluster and not slow and not bench'; alone=$$?; \
	[ $$both = 0 ] && [ $$cluster = 0 ] && [ $$alone = 0 ]

# The developer loop: unit, engine, scheduler, P/D and KV handoff in virtual time, real-compute
# correctness, config, trace loaders, sessions and routers, on both cores; no live Ray, Prometheus,
# `ray up`, HTTP server or fuzzing (those are `make test`'s, marked `full`).
test-fast: $(STAMP)
	$(PY) -m pytest -m 'not slow and not bench and not full' -n 2 --dist loadfile

# The `ray up` tests alone (~2 min).
test-cluster: $(STAMP) prometheus ssh-tools
	$(PY) -m pytest -m cluster tests/test_ray_up_cluster.py

APT_INSTALL = if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1); \
	elif command -v sudo >/dev/null; then sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1); \
	else echo "$(1) missing: install Debian's package (apt-get install $(1))" >&2; exit 1; fi

# A service the package starts (on a host with systemd) is stopped again: the testbed starts its own
# Prometheus, and the `ray up` test an SSH server of its own on port 22.
NO_SERVICE = { ! command -v systemctl >/dev/null || $$([ "$$(id -u)" = 0 ] || echo sudo) systemctl disable --now $(1) 2>/dev/null || true; }

prometheus:
	@command -v prometheus >/dev/null || { $(call APT_INSTALL,prometheus) && $(call NO_SERVICE,prometheus); }

# The report test renders report.html in headless Chromium (Debian's package).
chromium:
	@command -v chromium >/dev/null || $(call APT_INSTALL,chromium)

ssh-tools:
	@if [ "$$(id -u)" != 0 ]; then echo "the ray up tests will be skipped: they need root (port 22)"; \
	elif ! { [ -x /usr/sbin/sshd ] && command -v rsync >/dev/null; }; then \
		$(call APT_INSTALL,openssh-server rsync) && $(call NO_SERVICE,ssh); fi

bench: $(STAMP)
	$(PY) bench/guide_sweep.py
	$(PY) bench/runner_speed.py
	$(PY) bench/derender.py
	$(PY) bench/render_cost.py
	$(PY) bench/trace_replay.py
	$(PY) bench/soak.py
	$(PY) bench/soak.py --live --rounds 2
	$(PY) bench/overload.py

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check . && $(VENV)/bin/mypy

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache .mypy_cache
