"""Verifies webhook deliveries with the Standard Webhooks library (`standardwebhooks`).

Usage: verify.py SECRET DELIVERIES.jsonl

Each line of DELIVERIES.jsonl is one request as the receiver got it:
{"headers": {"webhook-id": ..., "webhook-timestamp": ..., "webhook-signature": ...}, "body": "<exact body>"}.
Prints one JSON line per delivery, {"id": ..., "ok": true} or {"id": ..., "ok": false, "error": ...},
then {"verified": N, "failed": M}. Exits 0 either way (the caller judges the lines).
"""

import json
import sys

from standardwebhooks import Webhook


def main() -> None:
    secret, path = sys.argv[1], sys.argv[2]
    hook = Webhook(secret)
    verified = failed = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            d = json.loads(line)
            headers = d["headers"]
            try:
                hook.verify(d["body"], headers)
                print(json.dumps({"id": headers.get("webhook-id"), "ok": True}))
                verified += 1
            except Exception as e:  # the library's verification errors, and malformed headers
                print(json.dumps({"id": headers.get("webhook-id"), "ok": False, "error": repr(e)}))
                failed += 1
    print(json.dumps({"verified": verified, "failed": failed}))


if __name__ == "__main__":
    main()
