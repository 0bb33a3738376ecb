"""What a filter's ``schema:`` costs per message, and what ``acklane test`` costs per case.

Prints, for an order-sized JSON body (the body is decoded by each message, as in a
run):

- a declarative filter's ``evaluate`` without a schema (the baseline, measured in
  this run) and with one (jsonschema-rs, draft 2020-12), per message, and the ratio;
- the validators alone on the decoded body: jsonschema-rs, and ``jsonschema`` /
  ``fastjsonschema`` when installed (``fastjsonschema`` with the same schema as
  draft 7, which it knows; it has no 2020-12);
- a refused body: the rejection with its path and message;
- ``acklane test`` on examples/pipeline.yaml's cases: cases per second, start-up
  of the pipeline included.

    uv run python bench/schema.py [--messages N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from acklane.core.message import RawMessage
from acklane.core.pipeline.filters import compile_filter

ROOT = Path(__file__).resolve().parents[1]

SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "id", "amount", "customer"],
    "properties": {
        "type": {"type": "string", "pattern": "^order\\."},
        "id": {"type": "integer", "minimum": 1},
        "amount": {"type": "number"},
        "customer": {
            "type": "object",
            "required": ["id"],
            "properties": {"id": {"type": "string"}},
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            },
        },
    },
}
BODY: dict[str, Any] = {
    "type": "order.created",
    "id": 7,
    "amount": 150.5,
    "customer": {"id": "c-1", "name": "Ada"},
    "items": [{"sku": f"sku-{i}", "qty": i} for i in range(1, 6)],
}
RULES: dict[str, Any] = {
    "match": {"body.type": "order.created", "body.amount": {"gt": 100}},
    "reject": {"body.amount": {"lt": 0}},
    "emit": {"order_id": "body.id", "amount": "body.amount"},
}


def per_call(fn: Callable[[], object], n: int) -> float:
    """Microseconds per call, the best of three rounds of ``n``."""
    return interleaved([fn], n)[0]


def interleaved(fns: list[Callable[[], object]], n: int, rounds: int = 5) -> list[float]:
    """Microseconds per call of each, the best of ``rounds`` rounds taken in turn (so a
    change of the machine's load falls on all of them alike)."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for index, fn in enumerate(fns):
            started = time.perf_counter()
            for _ in range(n):
                fn()
            best[index] = min(best[index], time.perf_counter() - started)
    return [b / n * 1e6 for b in best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    args = parser.parse_args()
    n = args.messages
    message = RawMessage(json.dumps(BODY).encode(), {"source": "web"}, "k", "m/0/1", source="t")
    bad = RawMessage(json.dumps({**BODY, "id": "seven"}).encode(), {}, "k", "m/0/2", source="t")

    plain = compile_filter(RULES, label="watcher w")
    checked = compile_filter({**RULES, "schema": SCHEMA}, label="watcher w")
    assert plain.evaluate(message) == checked.evaluate(message)
    print(f"filter.evaluate, {len(message.body)}-byte order, {n} messages, best of 5 in turn:")
    base, with_schema = interleaved(
        [lambda: plain.evaluate(message), lambda: checked.evaluate(message)], n
    )
    print(f"  without schema (baseline)   {base:7.2f} us/message")
    print(
        f"  with schema (jsonschema-rs) {with_schema:7.2f} us/message   "
        f"x{with_schema / base:.2f} of the baseline, +{with_schema - base:.2f} us"
    )
    refused = per_call(lambda: checked.evaluate(bad), n)
    print(f"  refused body (rejected)     {refused:7.2f} us/message   {checked.evaluate(bad)}")

    print("validators alone, on the decoded body:")
    import jsonschema_rs

    rs = jsonschema_rs.validator_for(SCHEMA)
    rs_us = per_call(lambda: rs.is_valid(BODY), n)
    print(f"  jsonschema-rs   {rs_us:7.2f} us/body")
    try:
        import jsonschema
    except ImportError:
        print("  jsonschema      (not installed)")
    else:
        py = jsonschema.Draft202012Validator(SCHEMA)
        py_us = per_call(lambda: py.is_valid(BODY), max(1, n // 10))
        print(f"  jsonschema      {py_us:7.2f} us/body   x{py_us / rs_us:.1f} of jsonschema-rs")
    try:
        import fastjsonschema
    except ImportError:
        print("  fastjsonschema  (not installed; no draft 2020-12 anyway)")
    else:
        draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", **SCHEMA}
        fast = fastjsonschema.compile(draft7)
        fast_us = per_call(lambda: fast(BODY), n)
        print(f"  fastjsonschema  {fast_us:7.2f} us/body   x{fast_us / rs_us:.1f} (draft 7)")

    from acklane.core.config import load_config
    from acklane.core.harness.cases import case_files, load_cases
    from acklane.core.harness.run import run_cases

    config = load_config(ROOT / "examples" / "pipeline.yaml")
    cases = load_cases(case_files(config.source), config) * 20
    started = time.perf_counter()
    results = asyncio.run(run_cases(config, cases))
    seconds = time.perf_counter() - started
    assert all(r.passed for r in results)
    print(
        f"acklane test: {len(cases)} cases of examples/pipeline.yaml in {seconds:.2f}s "
        f"({len(cases) / seconds:.0f} cases/s, the pipeline's start and stop included)"
    )


if __name__ == "__main__":
    main()
