"""Many simulated vLLM pods behind few endpoints, for a real Prometheus to scrape with
`honor_labels` (each sample carries its `pod` label): /group/<g>/metrics serves `--pods`
pods. One simulated replica's current-generation samples of the families the exporter
reads are the template; each pod's counters grow from them at a pace of its own, its
gauges stay. Cheap to serve, so that 10,000 pods fit on a 2-core machine beside
Prometheus and the exporter; prints {"port": ...} and serves until terminated."""
import argparse
import json
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.parse.names import SAMPLE_NAMES  # noqa: E402
from exporter.sim import simulator  # noqa: E402

_GROWING = ("_total", "_bucket", "_count", "_sum")


def template() -> list[tuple[str, str, float, bool]]:
    """(name, labels inside the braces, value, grows) of every sample the exporter reads."""
    replica = simulator.Replica("t", simulator.Scenario(request_rate=2.0), start=0.0, seed=1, generation="current")
    replica.advance(900.0)
    names = set(SAMPLE_NAMES)
    out = []
    for line in replica.render().splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, labels = head.partition("{")
        if name in names:
            out.append((name, labels.rstrip("}"), float(value), name.endswith(_GROWING) and not name.endswith("_created")))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--groups", type=int, default=100)
    p.add_argument("--pods", type=int, default=100, help="pods per group")
    args = p.parse_args()
    samples = template()
    started = time.time()

    def body(group: int) -> bytes:
        elapsed = time.time() - started
        out = []
        for i in range(args.pods):
            pod = f"vllm-{group}-{i}"
            grow = 1.0 + elapsed / 900.0 * (0.8 + (i % 5) / 10)
            for name, labels, value, grows in samples:
                v = value * grow if grows else value
                out.append(f'{name}{{pod="{pod}",{labels}}} {v}' if labels else f'{name}{{pod="{pod}"}} {v}')
        return ("\n".join(out) + "\n").encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            parts = self.path.strip("/").split("/")
            if len(parts) != 3 or parts[0] != "group" or not parts[1].isdigit() or int(parts[1]) >= args.groups:
                data, status = b"not found\n", 404
            else:
                data, status = body(int(parts[1])), 200
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(json.dumps({"port": server.server_address[1], "samples_per_pod": len(samples)}), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
