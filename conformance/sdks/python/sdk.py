"""Python's official Pusher server SDK (`pusher` on PyPI) driven by the
conformance suite (conformance/lib/sdk.mjs): one JSON request a line on stdin,
one JSON answer a line on stdout, and a webhook receiver whose requests are
checked with the SDK's own validator (`validate_webhook`)."""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pusher

client = pusher.Pusher(
    app_id=os.environ["APP_ID"],
    key=os.environ["APP_KEY"],
    secret=os.environ["APP_SECRET"],
    host=os.environ["HERALD_HOST"],
    port=int(os.environ["HERALD_PORT"]),
    ssl=False,
    timeout=5,
)

out_lock = threading.Lock()


def say(message):
    with out_lock:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


class Webhooks(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode("utf-8")
        # As a Flask or Django view reads them: by name, whatever their case.
        key = self.headers.get("X-Pusher-Key")
        signature = self.headers.get("X-Pusher-Signature")
        checked = client.validate_webhook(key, signature, body)
        tampered = client.validate_webhook(key, signature, body.replace("}", " }", 1))
        events = (checked or json.loads(body))["events"]
        self.send_response(200)
        self.end_headers()
        say({"webhook": {"valid": checked is not None, "tampered_valid": tampered is not None, "events": events}})

    def log_message(self, *args):
        pass


def handle(req):
    op = req["op"]
    if op == "trigger":
        client.trigger(req["channels"], req["event"], req["data"])
        return {}
    if op == "trigger_batch":
        client.trigger_batch(req["batch"])
        return {}
    if op == "channel":
        info = client.channel_info(req["channel"], [req["info"]])
        return {"occupied": info["occupied"], "user_count": info.get("user_count")}
    if op == "channels":
        listed = client.channels_info(prefix_filter=req["prefix"])
        return {"channels": sorted(listed["channels"].keys())}
    if op == "users":
        return {"ids": [u["id"] for u in client.users_info(req["channel"])["users"]]}
    if op == "auth":
        member = None
        if "user_id" in req:
            member = {"user_id": req["user_id"], "user_info": req.get("user_info")}
        return client.authenticate(req["channel"], req["socket_id"], member)
    if op == "user_auth":
        return client.authenticate_user(req["socket_id"], req["user"])
    if op == "terminate":
        client.terminate_user_connections(req["user_id"])
        return {}
    raise ValueError("unknown op %r" % op)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", int(os.environ["WEBHOOK_PORT"])), Webhooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    say({"ready": True})
    for line in sys.stdin:
        req = json.loads(line)
        try:
            say({"id": req["id"], "ok": handle(req)})
        except Exception as e:  # the test shows the SDK's own error
            say({"id": req["id"], "error": "%s: %s" % (type(e).__name__, e)})


main()
