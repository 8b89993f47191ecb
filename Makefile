# Thin wrapper: dependencies, configure, build, then the real work in CMake/ctest.
#   make verify   every backend against fixtures/golden (exit non-zero on any failure)
#   make test     the full test suite through ctest
#   make asan     the tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#   make coverage line and branch coverage of impls/ and reference/ by make verify's run (scripts/coverage)
#   make fixtures regenerate fixtures/golden from the case list
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
export OPENBLAS_CORETYPE ?= Haswell
# What make verify runs: every backend at 1 and 8 threads (8 > the tiles of the
# split-K cases, so several chunks run on any host) and in both layouts. The
# mutant tests (tests/mutants) read this line.
VERIFY_ARGS ?= --threads 1,8 --layout bhsd,bshd

.PHONY: all deps configure build verify test asan coverage fixtures clean

all: build

deps:
	@scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

verify: build
	$(BUILD)/bin/attn verify $(VERIFY_ARGS) --quiet --json $(BUILD)/verify.json --junit $(BUILD)/verify.xml

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

asan: deps
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_SANITIZE=ON $(CMAKE_FLAGS) > /dev/null
	@cmake --build build-asan -j $(JOBS)
	ctest --test-dir build-asan --output-on-failure -j $(JOBS) -LE slow

coverage: deps
	@VERIFY_ARGS="$(VERIFY_ARGS)" JOBS=$(JOBS) scripts/coverage

fixtures: build
	rm -rf fixtures/golden
	$(BUILD)/bin/attn fixtures generate --out fixtures/golden

clean:
	rm -rf $(BUILD) build-asan build-coverage
