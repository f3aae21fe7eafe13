# asap-train: set-up, build, run and test on a fresh Debian 12 machine (root or sudo).
#   make run    install what is missing, build, train the built-in default on 4 ranks
#   make test   install what is missing, build, run the whole test suite
SHELL := /bin/bash
NP ?= 4
ARGS ?=
CARGO ?= cargo
BIN := target/release/asap-train
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Build: MPI, BLAS, HDF5, libclang for rsmpi's bindgen. Run/test: data sets, h5py to check that
# our HDF5 files are readable by the usual Python tools, Slurm for the scheduler tests.
DEB_PACKAGES := libopenmpi-dev openmpi-bin libclang-dev clang libopenblas-dev libhdf5-dev gfortran \
	pkg-config dataset-fashion-mnist liblinear-tools python3-h5py python3-numpy \
	slurm-wlm slurmctld slurmd slurm-client munge

# Open MPI refuses root and more ranks than slots unless told; the program itself sets the
# one-sided component (osc=ucx) and yield-when-idle before MPI_Init.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1

.PHONY: all deps build run test bench clean test-mpich datasets

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
	mpirun -n $(NP) $(BIN) train --metrics runs/default.jsonl --save-model runs/default-model.h5 $(ARGS)

test: deps
	$(CARGO) test --release --locked -- --test-threads=1

# Real public data sets from Debian packages into datasets/out/ (MovieLens needs r-cran-dslabs,
# which the script installs; R is used once here, never at training time).
datasets:
	datasets/prepare.sh

bench: build
	$(BIN) bench

clean:
	$(CARGO) clean

# The one-sided layer against MPICH instead of Open MPI (separate build; not part of `make test`,
# which keeps CI short): the RMA checks at 1, 2 and 4 ranks with every notify mode.
MPICH_TARGET := target/mpich
test-mpich: deps
	@dpkg-query -W -f='$${Status}\n' mpich libmpich-dev 2>/dev/null | grep -vq 'install ok installed' && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends mpich libmpich-dev >/dev/null || true
	MPICC=mpicc.mpich CARGO_TARGET_DIR=$(MPICH_TARGET) $(CARGO) build --release --locked --bin rma-check
	for n in 1 2 4; do for m in notify-ack barrier none; do \
		mpiexec.mpich -n $$n $(MPICH_TARGET)/release/rma-check --graph ring --notify $$m --rounds 50 --len 7850 || exit 1; \
	done; done
