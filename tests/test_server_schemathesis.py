"""Schemathesis over /openapi.json: positive and negative generated requests never get a 5xx, and every
answer conforms to the schema (status code documented, content type, response body schema).

Slow (hundreds of requests): runs only with DEEPINFER_SLOW=1. max_tokens of generated valid
requests is clamped to 4 to keep generation short. With DEEPINFER_SCHEMATHESIS_OUT=FILE the
tallies are written as JSON (docs/results/server_schemathesis.json was produced this way).
"""
from __future__ import annotations

import collections
import json
import os
import time

import pytest

from engine.config import EngineConfig
from engine.server.app import ServerThread

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not os.environ.get("DEEPINFER_SLOW"), reason="slow: set DEEPINFER_SLOW=1")]
EXAMPLES = int(os.environ.get("DEEPINFER_SCHEMATHESIS_EXAMPLES", "40"))


def _clamp(body):
    if isinstance(body, dict):
        for k in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            v = body.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 4:
                body[k] = 4  # (a JSON integer may come as 5.0)
        if "input" in body and body.get("max_output_tokens") is None:  # /v1/responses
            body["max_output_tokens"] = 4
        if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = 4  # the default (rest of the context) would take minutes on CPU


def test_schemathesis_no_server_errors(llm):
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    tally: dict = collections.defaultdict(collections.Counter)
    failures: list = []
    conformance: dict = collections.defaultdict(collections.Counter)  # check -> operation -> count
    conformance_samples: list = []
    from schemathesis.checks import (content_type_conformance, negative_data_rejection,
                                     positive_data_acceptance, response_schema_conformance,
                                     status_code_conformance)
    strict = [status_code_conformance, content_type_conformance, response_schema_conformance]
    advisory = [negative_data_rejection, positive_data_acceptance]  # reported, not asserted
    samples: dict = collections.defaultdict(collections.Counter)
    t0 = time.monotonic()
    with ServerThread(EngineConfig(port=0, device="cpu", max_queue=64), llm=llm) as srv:
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
        for result in schema.get_all_operations():
            op = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
                          suppress_health_check=list(HealthCheck))
                @given(case=op.as_strategy(generation_mode=mode))
                def run(case):
                    _clamp(case.body)
                    r = case.call(base_url=srv.url, timeout=120)
                    tally[f"{op.method.upper()} {op.path} {mode.value}"][r.status_code] += 1
                    for check in strict + advisory:
                        try:
                            case.validate_response(r, checks=[check])
                        except (KeyboardInterrupt, SystemExit):
                            raise
                        except BaseException as e:  # schemathesis Failure / FailureGroup (an exception group)
                            conformance[check.__name__][f"{op.method.upper()} {op.path} {mode.value}"] += 1
                            if len(conformance_samples) < 40:
                                conformance_samples.append({"check": check.__name__, "op": op.path,
                                                            "status": r.status_code, "body": repr(case.body)[:500],
                                                            "error": str(e)[:500]})
                    if r.status_code >= 500:
                        failures.append({"op": op.path, "body": repr(case.body)[:4000], "status": r.status_code,
                                         "response": r.text[:500]})
                    elif r.status_code >= 300:
                        err = r.json()["error"]  # OpenAI-style error body
                        samples[f"{op.path} {mode.value}"][err["message"][:90]] += 1
                try:
                    run()
                except Unsatisfiable:  # e.g. no negative inputs exist for GET /v1/models
                    tally[f"{op.method.upper()} {op.path} {mode.value}"]["unsatisfiable"] += 0
        health = srv.worker.health()
    out = os.environ.get("DEEPINFER_SCHEMATHESIS_OUT")
    if out:
        doc = {"tool": f"schemathesis {schemathesis.SCHEMATHESIS_VERSION} (hypothesis, positive + negative)",
               "max_examples_per_operation_and_mode": EXAMPLES, "wall_s": round(time.monotonic() - t0, 1),
               "requests": sum(sum(c.values()) for c in tally.values()), "server_errors": len(failures),
               "status_by_operation": {k: dict(sorted(v.items())) for k, v in tally.items()},
               "error_messages": {k: dict(v.most_common(8)) for k, v in samples.items()},
               "failures": failures[:20],
               "conformance": {k: dict(v) for k, v in conformance.items()},
               "conformance_samples": conformance_samples, "server_after": health}
        with open(out, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=2)
    assert not failures, failures[:3]
    strict_names = {c.__name__ for c in strict}
    assert not any(conformance[n] for n in strict_names), (dict(conformance), conformance_samples[:3])
    assert health["active"] == 0 and health["state"] == "ready"
