"""What the serving benchmarks share: an `etch serve` on a free loopback port, started
and stopped, and a streamed request read chunk by chunk."""
import contextlib
import http.client
import json
import socket
import subprocess
import sys
import time


@contextlib.contextmanager
def etch_serve(etch, model, tokenizer, threads):
    """Runs `etch serve` on a free loopback port until the block ends; yields the port."""
    with etch_serve_process(etch, model, tokenizer, threads) as (port, _):
        yield port


@contextlib.contextmanager
def etch_serve_process(etch, model, tokenizer, threads, extra=(), log=None):
    """`etch_serve` with more flags; yields the port and the server's process. Its
    stderr goes to the open file `log` (a long run must not fill a pipe), else to a pipe
    read only if it fails to come up."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [etch, "serve", "--model", model, "--tokenizer", tokenizer, "--host", "127.0.0.1",
         "--port", str(port), "--threads", str(threads), *extra],
        stdout=subprocess.DEVNULL, stderr=log if log is not None else subprocess.PIPE)
    try:
        deadline = time.time() + 120
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                why = server.stderr.read().decode()[-2000:] if log is None else f"see {log.name}"
                sys.exit("etch serve did not come up: " + why)
            time.sleep(0.2)
        yield port, server
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def stream(port, path, body):
    """POSTs a streamed request; yields (arrival time, chunk) for each JSON chunk."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        sys.exit(f"etch serve answered {r.status}: {r.read()[:300]!r}")
    for raw in r:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield time.perf_counter(), json.loads(line[6:])
    conn.close()


def server_metrics(port):
    """`GET /metrics` of an `etch serve`: each `etch_*` sample by name."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("etch_"):
            name, value = line.split()
            out[name] = float(value)
    return out


def proc_status_bytes(pid, field):
    """A memory field of `/proc/PID/status` (`VmRSS`, `VmHWM`) in bytes; None if gone."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
