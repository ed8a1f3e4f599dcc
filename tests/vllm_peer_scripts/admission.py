"""vLLM's admission rule and its answer, for given queue states: what `AsyncLLM.check_admission` refuses,
the reason it counts, and the error body vLLM's API server makes of the exception.

Runs with the vLLM peer's python (`tests/vllm_peer.py`); imports only vLLM and the standard library.

    python admission.py CASES.json  ->  stdout: one JSON list, a result per case

CASES.json: a list of states, each
`{"max_num_queued_reqs": int | null, "max_num_queued_tokens": int | null, "num_reqs": int,
"num_tokens": int, "n": int}`: the limits, the requests in flight, the prompt tokens in prefill and the
new request's `n`. vLLM's own `check_admission` runs on a stand-in for its `AsyncLLM` holding exactly
those (its scheduler config's two limits, no shared admission stats, the two counts). Each result:
`{"reason": the rejection counted (`_record_admission_rejection`) | null, "error": the exception's
class name | null, "status": its HTTP status | null, "body": `create_error_response(exception)` as
JSON | null}`.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from vllm.entrypoints.serve.exception_handling.error_response import create_error_response
from vllm.exceptions import GracefulHTTPError
from vllm.v1.engine.async_llm import AsyncLLM


def check(case: dict[str, Any]) -> dict[str, Any]:
    counted: list[str] = []
    engine = SimpleNamespace(
        scheduler_config=SimpleNamespace(
            max_num_queued_reqs=case["max_num_queued_reqs"],
            max_num_queued_tokens=case["max_num_queued_tokens"],
        ),
        admission_stats=None,
        get_num_unfinished_requests=lambda: case["num_reqs"],
        get_num_queued_tokens=lambda: case["num_tokens"],
        _record_admission_rejection=counted.append,
    )
    try:
        AsyncLLM.check_admission(engine, case["n"], request_id="r")  # type: ignore[arg-type]
    except GracefulHTTPError as e:
        body = create_error_response(e).model_dump(mode="json")
        return {"reason": counted[-1], "error": type(e).__name__, "status": int(e.http_status), "body": body}
    return {"reason": None, "error": None, "status": None, "body": None}


def main() -> None:
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    json.dump([check(case) for case in cases], sys.stdout)


if __name__ == "__main__":
    main()
