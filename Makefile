# The two commands of the README's quick start, and a few conveniences around them.
# `make run` and `make test` install what is missing, build the release preset, then run.
PRESET ?= release
JOBS ?= $(shell nproc)

.PHONY: deps build run test bench asan clean
deps:
	./scripts/install-deps.sh

build: deps
	cmake --preset $(PRESET) >/dev/null
	cmake --build --preset $(PRESET) -j $(JOBS)

run: build
	./scripts/run-main.sh build/$(PRESET)

test: build
	ctest --preset $(PRESET) -j $(JOBS)

asan:
	$(MAKE) test PRESET=asan

clean:
	rm -rf build
