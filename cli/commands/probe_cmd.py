"""``kelp probe --config FILE --url http://host:port``: is that replica ready and scoring?

GET ``/readyz``, then POST ``/v1/score`` with one synthetic sample built from
the config's feature spec (every dense feature at its default, id 0 for every
sparse feature). Prints one line; exit 0 when both succeed, 1 otherwise. The
Helm test hook runs exactly this. Standard library HTTP only, so the probe
needs nothing beyond Kelp itself.

The score request carries ``X-Kelp-Synthetic: 1``: the replica scores it but
keeps it out of the request log, so a probe never becomes an impression (and,
after ``kelp join``, a negative) in training.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.error
import urllib.request
from typing import Any

from kelp.config import FeatureSpec, load_config
from kelp.redaction import redact_url

__all__ = ["PROBE_HEADERS", "probe_sample", "register"]

PROBE_HEADERS = {"X-Kelp-Synthetic": "1"}
"""Headers of the probe's score request: marked synthetic (scored, never in the request log)."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("probe", help="check that a serving replica is ready and scores a sample")
    parser.add_argument("--config", required=True, help="Kelp config file (the replica's feature spec)")
    parser.add_argument("--url", required=True, help="replica base URL, e.g. http://kelp-serve:8080")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per HTTP call (default 5)")
    parser.set_defaults(handler=_probe)


def probe_sample(spec: FeatureSpec) -> dict[str, Any]:
    """One sample with every configured feature: dense at its default, sparse id 0."""
    return {
        "dense": {f.name: f.default for f in spec.dense},
        "sparse": {f.name: [0] for f in spec.sparse},
    }


def _call(
    url: str, timeout: float, body: dict[str, Any] | None = None, token: bytes | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST")
    if data is not None:
        request.add_header("Content-Type", "application/json")
        for name, value in PROBE_HEADERS.items():
            request.add_header(name, value)
    if token is not None:  # serving.auth_token_file: the score endpoints want the bearer token
        request.add_header("Authorization", "Bearer " + token.decode("ascii"))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"null")
        except ValueError:
            return exc.code, None


def _probe(args: argparse.Namespace) -> int:
    from kelp.serving.auth import load_token

    cfg = load_config(args.config)
    token = load_token(cfg.serving.auth_token_file)
    base = args.url.rstrip("/")
    shown = redact_url(base)  # what is printed: a password in the URL stays hidden
    started = time.perf_counter()
    try:
        status, body = _call(f"{base}/readyz", args.timeout)
        if status != 200:
            reason = body.get("reason") if isinstance(body, dict) else body
            print(f"probe failed: {shown}/readyz answered {status}: {reason}")
            return 1
        sample = {"samples": [probe_sample(cfg.features)]}
        status, body = _call(f"{base}/v1/score", args.timeout, sample, token)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"probe failed: {shown}: {exc}")
        return 1
    if status != 200 or not isinstance(body, dict) or len(body.get("scores") or []) != 1:
        print(f"probe failed: {shown}/v1/score answered {status}: {body}")
        return 1
    elapsed_ms = (time.perf_counter() - started) * 1000
    print(
        f"probe ok: {shown} model v{body['model_version']} score {body['scores'][0]:.4f} "
        f"default_row_rate {body['default_row_rate']:.2f} ({elapsed_ms:.0f} ms)"
    )
    return 0
