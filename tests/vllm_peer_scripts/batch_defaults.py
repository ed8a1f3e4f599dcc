"""vLLM's own defaults of max_num_batched_tokens and max_num_seqs for `vllm serve` on given devices:
`EngineArgs.get_batch_defaults`, with the platform answering each device's total memory and name as
NVML would (a CUDA platform: not the CPU's or a TPU's branch).

Runs with the vLLM peer's python (`tests/vllm_peer.py`); imports only vLLM and the standard library.

    python batch_defaults.py DEVICES.json  ->  stdout: one JSON list, [max_num_batched_tokens,
                                               max_num_seqs] per device

DEVICES.json: a list of `{"memory_bytes": int, "name": str}`.
"""

from __future__ import annotations

import json
import os
import sys
from unittest import mock

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from vllm.usage.usage_lib import UsageContext


def defaults(device: dict[str, object]) -> list[int]:
    with (
        mock.patch.object(
            type(current_platform), "get_device_total_memory", lambda *a, **k: device["memory_bytes"]
        ),
        mock.patch.object(type(current_platform), "get_device_name", lambda *a, **k: device["name"]),
        mock.patch.object(type(current_platform), "is_cpu", lambda *a, **k: False),
        mock.patch.object(type(current_platform), "is_tpu", lambda *a, **k: False),
    ):
        tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
    server = UsageContext.OPENAI_API_SERVER
    return [tokens[server], seqs[server]]


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        devices = json.load(f)
    print(json.dumps([defaults(d) for d in devices]))
