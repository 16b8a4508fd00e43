"""A payments app on Stripe's own Python SDK, charging through the proxy.

Run by envoy/tests/stripe_sdk.rs: `python3 stripe_charges.py PROXY_URL UPSTREAM_URL`.
`stripe.api_base` points at the proxy on loopback, whose upstream answers like
Stripe's charges endpoint. Each step prints one JSON line: what the SDK returned
(`charge`), or which exception it raised, with what the app can read from it;
the Rust test asserts on those lines. The client itself asserts nothing.

Retries: the SDK retries a 409 and any 5xx itself (`max_network_retries`, 2 by
default, after 0.5 s and more of backoff), which would hide the answer each
request got. The steps turn them off (`max_network_retries = 0`) but for one
(`sdk_retry`), which keeps the SDK's own retry of Envoy's 503 for an upstream
reset: that retry is the one that meets the kept unknown outcome.
"""

import json
import sys
import threading
import time
import urllib.request

import stripe

PROXY, UPSTREAM = sys.argv[1], sys.argv[2]
stripe.api_key = "sk_test_proxy_dedup"
stripe.api_base = PROXY
stripe.max_network_retries = 0


def emit(step, **fields):
    print(json.dumps({"step": step, **fields}), flush=True)


def charge(key, amount=1000, headers=None, retries=0):
    return stripe.Charge.create(
        amount=amount,
        currency="usd",
        source="tok_visa",
        idempotency_key=key,
        headers=headers or {},
        max_network_retries=retries,
    )


def attempt(step, key, **kw):
    """One charge: what the app got, as a JSON line."""
    try:
        c = charge(key, **kw)
        emit(step, charge=c.id, amount=c.amount,
             replayed=c.last_response.headers.get("idempotent-replayed"))
        return None
    except stripe.StripeError as e:
        err = e.error
        emit(
            step,
            raised=type(e).__name__,
            idempotency_error=isinstance(e, stripe.IdempotencyError),
            http_status=e.http_status,
            message=e.user_message,
            type=getattr(err, "type", None),
            code=getattr(err, "code", None),
            retry_after=(e.headers or {}).get("retry-after"),
            expires=(e.headers or {}).get("idempotency-expires"),
        )
        return e


def executions_of(key):
    with urllib.request.urlopen(UPSTREAM + "/__executions", timeout=5) as r:
        return json.load(r).get("by_key", {}).get(key, 0)


def wait_until(what, done, limit=8.0):
    end = time.monotonic() + limit
    while not done():
        if time.monotonic() > end:
            emit("timeout", waiting_for=what)
            sys.exit(2)
        time.sleep(0.02)


# A charge, its replay, and the key reused for another amount.
attempt("first", "order-1")
attempt("replay", "order-1")
attempt("mismatch", "order-1", amount=2500)

# A retry while the first charge still runs at the upstream (it takes 3 s).
slow = threading.Thread(
    target=attempt, args=("slow_first", "order-2"),
    kwargs={"headers": {"x-demo-delay-ms": "3000"}},
)
slow.start()
wait_until("order-2 to reach the upstream", lambda: executions_of("order-2") == 1)
attempt("in_flight", "order-2")
slow.join()

# The upstream charges, then resets the connection: Envoy answers 503 itself, and
# the charge's outcome is unknown. The app's retry with the key gets the kept
# record's answer (once Envoy has ended the first stream: until then it is in flight).
attempt("reset", "order-3", headers={"x-demo-fault": "reset"})
end = time.monotonic() + 5
while True:
    e = attempt("unknown", "order-3")
    if e is None or getattr(e.error, "code", None) != "idempotency_key_in_use":
        break
    if time.monotonic() > end:
        break
    time.sleep(0.1)

# The same, with the SDK retrying Envoy's 503 itself (after its backoff).
attempt("sdk_retry", "order-4", headers={"x-demo-fault": "reset"}, retries=1)
