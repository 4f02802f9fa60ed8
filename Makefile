# The two commands of the README:
#   make demo   install what is missing, build Release into build/, train the example GPT with ZeRO
#               on 2 local processes on the shipped text
#   make test   install what is missing, build, run every test with ctest
#   make        the same as make build: install what is missing, configure and build build/
BUILD   ?= build
JOBS    ?= $(shell nproc)
DEMO_PROCS ?= 2
# A libtorch 2.x (wheel or archive, CPU or CUDA) instead of Debian's 1.13: TORCH_DIR=<its folder>
# (docs/gpu.md). CMAKE_ARGS passes anything else to the configure step.
TORCH_DIR ?=
# UNITY=OFF: one translation unit per source (faster rebuilds while editing; CMakeLists.txt).
# Every make call sets DS_UNITY_BUILD in $(BUILD)'s cache to $(UNITY): a later `make test`
# without UNITY=OFF turns unity batches back on there.
UNITY ?= ON
CMAKE_ARGS ?=

.PHONY: demo test build deps clean
# deps is the first rule, so without this a plain `make` only installed packages.
.DEFAULT_GOAL := build

deps:
	@TORCH_DIR="$(TORCH_DIR)" bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DDS_UNITY_BUILD=$(UNITY) $(if $(TORCH_DIR),-DTORCH_DIR=$(TORCH_DIR)) $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	OMP_NUM_THREADS=1 $(BUILD)/bin/dsrun --num_procs $(DEMO_PROCS) $(BUILD)/bin/gpt_train \
	  --deepspeed_config examples/gpt/ds_config.json --data data/fortunes.txt --steps 200

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD)
