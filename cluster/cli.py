"""`testbed`: run one design or sweep designs × rates × seeds, writing a reproducible run directory.

testbed run   --preset guide-l40s [--design collocated] [--rate 0.4] [--set key=value ...] [--out DIR]
testbed sweep --preset guide-l40s --rates 0.2,0.4 --seeds 5 --num-requests 100 [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cluster.config import TestbedConfig
from cluster.config_load import ConfigError, available_presets, dump_config, load_designs


def _parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--rates={text!r}: expected comma-separated numbers, e.g. 0.2,0.4") from None
    bad = [r for r in rates if not r > 0]
    if not rates or bad:
        raise ConfigError(f"--rates={text!r}: every rate must be > 0 requests/s")
    return rates


def _overrides(args: argparse.Namespace) -> list[str]:
    """CLI shortcuts become `--set` overrides, so every path goes through one validation."""
    out = []
    for flag, key in (
        ("compute", "runner.compute"),
        ("mode", "clock.mode"),
        ("rate", "workload.rate"),
        ("num_requests", "workload.num_requests"),
        ("seed", "seed"),
        ("output_policy", "workload.output_policy"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"{key}={value}")
    return out + list(args.set or [])


def _configs(args: argparse.Namespace) -> list[TestbedConfig]:
    source = args.config or args.preset
    designs = [d for d in (args.design or "").split(",") if d] or None
    return load_designs(source, designs, _overrides(args))


def _out_dir(args: argparse.Namespace, kind: str) -> Path:
    out = Path(args.out or Path("runs") / f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "configs").mkdir(exist_ok=True)
    return out


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, allow_nan=False, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, float):
        return None
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _clean(obj: Any) -> Any:
    """NaN -> None, recursively, so JSON stays strict."""
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def cmd_run(args: argparse.Namespace) -> int:
    import pandas as pd
    from rich.progress import Progress

    from cluster.virtual import run_virtual
    from dashboards.console import run_table, show

    configs = _configs(args)
    out = _out_dir(args, "run")
    records, frames, engines = [], [], {}
    for cfg in configs:
        dump_config(cfg, out / "configs" / f"{cfg.design}.yaml")
        with Progress(transient=True) as progress:
            task = progress.add_task(f"{cfg.design}: requests", total=cfg.workload.num_requests)
            result = run_virtual(cfg, on_result=lambda _: progress.advance(task))  # noqa: B023 (used in-loop)
        records.append(_clean(result.summary))
        frames.append(result.results)
        engines[cfg.design] = result.engine_reports
    pd.concat(frames, ignore_index=True).to_parquet(out / "results.parquet", index=False)
    _write_json(out / "summary.json", records)
    _write_json(out / "engines.json", _clean(engines))
    show(run_table(records))
    print(f"run directory: {out}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from rich.progress import Progress

    from cluster.sweep import run_sweep, sweep_points
    from dashboards.console import goodput_table, show, sweep_table
    from workloads.summary import sweep_goodput

    rates = _parse_rates(args.rates)
    if args.seeds < 1:
        raise ConfigError(f"--seeds={args.seeds}: must be >= 1 (the number of seeds per point)")
    configs = _configs(args)
    out = _out_dir(args, "sweep")
    for cfg in configs:
        dump_config(cfg, out / "configs" / f"{cfg.design}.yaml")
    points = sweep_points(configs, rates, [configs[0].seed + i for i in range(args.seeds)])
    start = time.perf_counter()
    with Progress(transient=True) as progress:
        task = progress.add_task(f"{len(points)} runs", total=len(points))
        result = run_sweep(points, args.jobs, on_done=lambda: progress.advance(task))
    wall_s = time.perf_counter() - start
    records = _clean(result.records)
    goodput = sweep_goodput(records)
    result.results.to_parquet(out / "results.parquet", index=False)
    _write_json(out / "runs.json", _clean(result.runs))
    _write_json(out / "summary.json", records)
    _write_json(out / "goodput.json", goodput)
    num_requests = sum(r["completed"] + r["failed"] for r in result.runs)
    _write_json(
        out / "timing.json",
        {
            "wall_s": wall_s,
            "num_runs": len(points),
            "num_requests": num_requests,
            "requests_per_wall_s": num_requests / wall_s,
        },
    )
    title = f"{configs[0].target.model}: {len(configs)} designs x {len(rates)} rates x {args.seeds} seeds"
    show(sweep_table(records, title), goodput_table(goodput))
    print(f"{len(points)} runs, {num_requests} requests in {wall_s:.1f} s wall; run directory: {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="testbed", description="Emulate disaggregated LLM serving.")
    sub = p.add_subparsers(dest="command", required=True)
    for name, helptext in (("run", "run each design once"), ("sweep", "designs x rates x seeds")):
        s = sub.add_parser(name, help=helptext)
        src = s.add_mutually_exclusive_group()
        src.add_argument("--preset", default="guide-l40s", help=f"one of: {', '.join(available_presets())}")
        src.add_argument("--config", help="a YAML config file (flat, or base + designs)")
        s.add_argument("--design", help="comma-separated designs of the preset (default: all)")
        s.add_argument("--mode", help="clock mode: virtual")
        s.add_argument("--compute", help="real | skip")
        s.add_argument("--output-policy", help="forced | greedy")
        s.add_argument("--num-requests", type=int)
        s.add_argument("--seed", type=int, help="base seed")
        s.add_argument("--set", action="append", metavar="KEY=VALUE", help="override any config field")
        s.add_argument("--out", help="run directory (default: runs/<time>-<command>)")
        if name == "run":
            s.add_argument("--rate", type=float, help="requests per emulated second")
        else:
            s.add_argument("--rates", default="0.2,0.4,0.6,1.0,1.5,2.0", help="comma-separated req/s")
            s.add_argument("--seeds", type=int, default=1, help="seeds per point (base seed, base+1, ...)")
            s.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel processes")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return cmd_run(args) if args.command == "run" else cmd_sweep(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
