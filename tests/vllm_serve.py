"""A real `vllm serve` (the vLLM peer's CPU build, `vllm_peer.py`) of the project's tiny model, for tests
that hold the testbed's HTTP API against vLLM's.

The tiny Qwen2 runner reshaped to 2 heads / 1 KV head (head_dim 32: vLLM's CPU attention serves no
head_dim 16), the project's own tokenizer and chat template, blocks of 32 (the CPU attention backend's
multiple), float32, prefix caching, `usage.prompt_tokens_details` on, and the `deepseek_r1` reasoning
parser: it reads everything before `</think>` as reasoning (its models open `<think>` in the prompt),
so the random model's output streams as `delta.reasoning` up to a `</think>` it may happen to sample;
the `hermes` tool parser, so `tool_choice: required` gets a call (vLLM's structured output writes it).
Nothing is downloaded. `--max-num-queued-reqs` bounds the requests it holds, so a burst shows how vLLM
refuses one (a 503). It starts in 70-110 s on two cores.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from actors.engine.runner.tiny_model import ensure_model
from actors.render.tokenizer import ensure_tokenizer
from emulation.config import RunnerConfig
from tests.factories import free_port
from tests.vllm_peer import SCRIPTS, require_vllm_python

MODEL_NAME = "tiny-qwen2"
MAX_NUM_QUEUED_REQS = 16
"""vLLM refuses a request arriving while it holds this many (running and waiting): a 503."""
START_TIMEOUT_S = 420.0


class VllmServe:
    """`vllm serve` in a process group of its own on a free loopback port, until `stop()`; its log
    goes to `log` (shown when it fails to start)."""

    def __init__(self, log: Path) -> None:
        python = require_vllm_python()  # skips the caller with one line when the peer cannot run
        runner = RunnerConfig(num_heads=2, num_kv_heads=1)
        model, tokenizer = ensure_model(runner), ensure_tokenizer(runner.vocab_size)
        self.model = MODEL_NAME
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [str(python), str(SCRIPTS / "vllm_cli.py"), "serve", str(model),
               "--tokenizer", str(tokenizer), "--chat-template", str(tokenizer / "chat_template.jinja"),
               "--served-model-name", MODEL_NAME, "--block-size", "32", "--dtype", "float32", "--seed", "0",
               "--enable-prompt-tokens-details", "--enable-prefix-caching",
               "--reasoning-parser", "deepseek_r1", "--max-num-queued-reqs", str(MAX_NUM_QUEUED_REQS),
               "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               "--host", "127.0.0.1", "--port", str(self.port)]  # fmt: skip
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
               "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "VLLM_LOGGING_LEVEL": "WARNING"}  # fmt: skip
        env.pop("PYTHONPATH", None)  # the project's packages stay out of vLLM's interpreter
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"vllm serve exited ({self.proc.returncode}):\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"vllm serve not healthy in {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")
            time.sleep(1.0)

    def log_tail(self, num_chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-num_chars:]

    def stop(self) -> None:
        """SIGINT to its process group (the API server and its engine process); SIGKILL to what is left
        of the group after 30 s, or once the server is gone."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
