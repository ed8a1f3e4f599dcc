"""Live mode computes off the event loop (`Executor(in_thread=True)`): an abort handled on the loop
while the step's forward pass runs in its thread must not leave the runner holding working KV."""

import asyncio
import threading
import time

from actors.engine.clock import Clock
from actors.engine.runner.model_runner import ModelRunner
from cluster.virtual import build_deployment
from messages import EngineRequest
from tests.factories import COLLOCATED, make_config, make_requests

REAL = {"runner": {"compute": "real", "device": "cpu"}, "workload": {"output_policy": "greedy"}}


def test_aborts_landing_mid_step_leave_no_working_kv(monkeypatch):
    """Each forward pass waits, in its thread, until the test has aborted one of the step's requests
    on the event loop (its first step: the prompt; a later one: a decode), then computes. Every
    request ends, and the runner and the engine are empty after."""
    mid_step = threading.Event()  # the forward pass has started in its thread
    aborted = threading.Event()  # the test aborted a request while it waited
    done = threading.Event()  # no more aborts: steps run at once
    execute = ModelRunner.execute

    def slow_execute(self, items):
        if not done.is_set():
            mid_step.set()
            aborted.wait(timeout=5)
            aborted.clear()
        return execute(self, items)

    monkeypatch.setattr(ModelRunner, "execute", slow_execute)

    async def main():
        cfg = make_config(COLLOCATED, REAL)
        dep = build_deployment(cfg, Clock(1.0, epoch_s=time.monotonic()), compute_in_thread=True)
        (engine,) = dep.engines
        engine.start()
        reqs = make_requests(4, 48, 6, vocab=cfg.runner.vocab_size)
        streams = {
            r.request_id: engine.generate(EngineRequest(r.request_id, r.prompt_token_ids, 6)) for r in reqs
        }
        finals = {}

        async def consume(rid, stream):
            async for out in stream:
                if out.finished_reason is not None:
                    finals[rid] = out.finished_reason

        tasks = [asyncio.ensure_future(consume(rid, s)) for rid, s in streams.items()]
        for r in reqs[:3]:  # r0 aborted in the prompts' step, r1 and r2 in decode steps
            while not mid_step.is_set():
                await asyncio.sleep(0.001)
            mid_step.clear()
            engine.abort(r.request_id)
            aborted.set()
        done.set()
        await asyncio.gather(*tasks)
        await engine.drain()
        engine.assert_empty()  # no request, block, stream, nor working KV left
        return finals

    finals = asyncio.run(main())
    assert sorted(finals.values()) == ["abort", "abort", "abort", "length"]
