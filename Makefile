# Thin wrapper: dependencies, configure, build, then the real work in CMake/ctest.
#   make verify    every backend against fixtures/golden (exit non-zero on any failure)
#   make test      every test through ctest but the `full` tier, then the ten slowest tests
#   make test-full every test, the `full` tier too (the whole of what `make test` samples)
#   make test-fast the tests labelled fast (ctest -L fast): the quick loop
#   make docs      the documentation site (MkDocs, --strict) into build/site
#   make asan      the tests again under AddressSanitizer + UndefinedBehaviorSanitizer
#   make coverage  line and branch coverage of impls/ and reference/ by make verify's run (scripts/coverage)
#   make fixtures  regenerate fixtures/golden from the case list
#   make fuzz-long the fuzzer as a gate: FUZZ_SEEDS x FUZZ_CASES over every CPU backend, forward and backward
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
export OPENBLAS_CORETYPE ?= Haswell
# What make verify runs: every backend at 1 and 8 threads (more threads than
# cores, and than the tiles of the split-K cases) and in both layouts. The
# mutant tests (tests/mutants) read this line.
VERIFY_ARGS ?= --threads 1,8 --layout bhsd,bshd

.PHONY: all deps configure build verify test test-full test-fast docs asan coverage fuzz-targets fuzz-short fuzz-long fixtures clean

all: build

deps:
	@scripts/install-deps

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

verify: build
	$(BUILD)/bin/attn verify $(VERIFY_ARGS) --quiet --json $(BUILD)/verify.json --junit $(BUILD)/verify.xml

# Every test carries a cost label (fast, slow or full); scripts/test-report
# prints the ten slowest and fails when a test has none.
# ctest runs JOBS tests at once, each with threads of its own: OpenBLAS's
# thread server (NumPy's products, and each openblas_set_num_threads that
# the openblas backend puts back) spins with sched_yield on the cores the
# other tests need. Measured on make verify's run: half its system time, 18
# CPU seconds. The openblas backend runs one OpenBLAS thread a call anyway.
TEST_ENV = OPENBLAS_NUM_THREADS=1
test: build
	@$(TEST_ENV) ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE full --output-junit ctest.xml; status=$$?; \
	  scripts/test-report $(BUILD) || status=1; exit $$status

test-full: build
	@$(TEST_ENV) ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --output-junit ctest.xml; status=$$?; \
	  scripts/test-report $(BUILD) || status=1; exit $$status

test-fast: build
	$(TEST_ENV) ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -L fast

# The generated pages (command reference, support matrix) come from the built
# attn; mkdocs --strict fails on a broken link or a page missing from the nav.
docs: build
	@scripts/gen-docs $(BUILD)/bin/attn docs
	mkdocs build --strict --config-file mkdocs.yml --site-dir $(BUILD)/site

asan: deps
	@cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DATTN_SANITIZE=ON $(CMAKE_FLAGS) > /dev/null
	@cmake --build build-asan -j $(JOBS)
	$(TEST_ENV) ctest --test-dir build-asan --output-on-failure -j $(JOBS)

coverage: deps
	@VERIFY_ARGS="$(VERIFY_ARGS)" JOBS=$(JOBS) scripts/coverage

# libFuzzer targets (tests/fuzz), built with clang, ASan and UBSan in build-fuzz/.
fuzz-targets:
	@ATTN_EXTRA_PACKAGES="clang libclang-rt-14-dev" scripts/install-deps  # libFuzzer and the sanitizer runtimes
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -gline-tables-only" -DATTN_FUZZ=ON \
	  -DATTN_BUILD_TESTS=OFF -DATTN_WITH_CUDA=OFF > /dev/null
	@cmake --build build-fuzz -j $(JOBS) --target fuzz_problem_parse fuzz_fixture_structured fuzz_fixture_bytes

# A short fixed-time run of the targets CI runs, seeded from tests/fuzz/corpus.
FUZZ_SECONDS ?= 20
fuzz-short: fuzz-targets
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz-short build-fuzz/fuzz

# Every seed of FUZZ_SEEDS, FUZZ_CASES cases each, over every CPU backend
# (a nightly job's gate: a few minutes a seed on two cores); each failure is
# shrunk into $(BUILD)/fuzz-long/seed<S>/ with the command that reproduces
# it. Exit 1 when any seed found one, after running them all.
FUZZ_SEEDS ?= 1 2 3 4 5 6 7 8 9 10
FUZZ_CASES ?= 2000
FUZZ_BACKENDS ?= naive,blocked,streaming,openblas,onednn
fuzz-long: build
	@status=0; for seed in $(FUZZ_SEEDS); do \
	  echo "fuzz-long: seed $$seed, $(FUZZ_CASES) cases, $(FUZZ_BACKENDS)"; \
	  mkdir -p $(BUILD)/fuzz-long; log=$(BUILD)/fuzz-long/seed$$seed.log; \
	  $(BUILD)/bin/attn fuzz --seed $$seed --cases $(FUZZ_CASES) -b $(FUZZ_BACKENDS) \
	    --out $(BUILD)/fuzz-long/seed$$seed > $$log 2>&1 || status=1; \
	  grep -v ' cases, ' $$log | tail -n 12; \
	done; exit $$status

fixtures: build
	rm -rf fixtures/golden
	$(BUILD)/bin/attn fixtures generate --out fixtures/golden

clean:
	rm -rf $(BUILD) build-asan build-coverage build-fuzz
