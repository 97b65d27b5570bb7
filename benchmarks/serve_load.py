"""Load test of `llmpress serve` on loopback: bounded in requests and time, stops by itself.

For each batch capacity C (default 1, 8, 32) a server runs the w4 artifact (RTN g64 zero
point, lm_head int8) with a queue bound of C; N = 1×, 2×, 4× C concurrent clients each
send one streaming completion (prompt ~20 tokens, exactly 64 tokens out with
`ignore_eos`, greedy; each client's prompt starts with its own number, so no two share a
cached block, not even with an earlier run). Reported: served
and refused (429) requests — every request must end one way or the other, none may hang —
requests/s, output tokens/s, p50/p99 time to first token and time per output token. Then
a run where a third of the clients disconnect mid-stream, after which the server's
metrics must show no running request and no KV slot in use.

In the same run, per capacity C: `bench` of the same artifact at batch C (its decode
tok/s: what C streams could get at most), in a process of its own while the server idles,
before and after each of `--rounds` runs of C clients. This shared machine's speed drifts
by a third within minutes, so each run's rate is compared with the mean of the two
`bench` runs around it, and the median round is reported. Each `bench` run gives its
decode rate and its whole-batch rate (the batch's tokens over the time from its prompts
to its last token: the prefill a served rate also counts), and each C-client round
records where the engine's thread spent it (prefill halves, decode halves, publishing
tokens with the events written then: StepClock). And with `--llama-server BIN
--gguf Q4_0.gguf` llama.cpp's own server (native build, `-np C -c 256·C -t 2 -tb 2`,
continuous batching, its other settings its defaults: its flash attention, on by default,
served 32 of these short streams as fast as without it, 170-195 against 159-165 tokens/s
in one check here) on the same C clients, prompts and greedy settings, the rows of the two
servers interleaved.

The clients run in a process of their own, for both servers, as real clients do: as
threads inside llmpress's server process they took its interpreter lock and a core from
the engine's decode steps (one run, capacity 32: 0.70 of `bench` with the clients inside,
0.91 with them outside). They are read by one thread through a selector, as an event-loop
load generator reads them: a thread per client used 0.11 s of CPU a 32-client round, on
the cores the server runs on, the selector 0.05 s (served tokens/s 1.03x, 12 ABBA pairs).

    python benchmarks/serve_load.py [--capacities 1,8,32] [--tokens 64] [--name serve_load] \
        [--llama-server PATH/TO/llama.cpp/build/bin --gguf model-q4_0.gguf]
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import platform
import selectors
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import torch

from compress.kernels.cpu import set_threads
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe
from compress.runtime.bench import run_bench
from compress.runtime.kv_cache import kv_scheme
from compress.runtime.weights import load_weights
from compress.serve.app import build_app
from compress.serve.server import make_server

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from batched_decode import cpu_flags  # noqa: E402
from llama_server import add_arguments, check_arguments, llama_server, version  # noqa: E402

PROMPT = "The history of the city begins in the early middle ages, when a small settlement"


class Client:
    """One streaming completion on a non-blocking socket: its send time, and the time each
    server-sent event arrived (events that arrive in one read share its time)."""

    def __init__(self, port: int, i: int, tokens: int, disconnect_after: int | None):
        prompt = f"Note {i}: {PROMPT}"  # a number no other request has: no block to share
        body = {"prompt": prompt, "max_tokens": tokens, "stream": True, "temperature": 0}
        body = json.dumps({**body, "ignore_eos": True}).encode()  # every reply as long as bench's
        self.disconnect_after = disconnect_after
        self.head, self.body, self.status = b"", b"", None
        self.stamps: list[float] = []  # one per data event but [DONE]
        self.result: dict | None = None
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.t0 = time.perf_counter()
        self.sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        )
        self.sock.setblocking(False)

    def feed(self, data: bytes, now: float) -> bool:
        """Take what one read returned; False when the request is over (self.result set)."""
        if not data:  # the server closed the connection before [DONE]
            return self._end({"status": "error closed"})
        if self.status is None:
            self.head += data
            if b"\r\n\r\n" not in self.head:
                return True
            self.head, _, data = self.head.partition(b"\r\n\r\n")
            self.status = int(self.head.split(None, 2)[1])
            if self.status != 200:
                return self._end({"status": self.status})
        *events, self.body = (self.body + data).split(b"\n\n")
        for event in events:
            if b"data: [DONE]" in event:
                return self._end(None)
            if b"data: " in event:
                self.stamps.append(now)
                if self.disconnect_after and len(self.stamps) >= self.disconnect_after:
                    return self._end({"status": "disconnected"})
        if self.body.endswith(b"\r\n0\r\n\r\n"):  # the last chunk, without a [DONE] event
            return self._end(None)
        return True

    def _end(self, result: dict | None) -> bool:
        if result is None and not self.stamps:
            result = {"status": "error no events"}
        if result is None:  # a whole reply: the last event carries the finish reason
            s, n = self.stamps, len(self.stamps) - 1
            tpot = (s[-2] - s[0]) / max(n - 1, 1) if n > 1 else None
            result = {"status": 200, "ttft": s[0] - self.t0, "tpot": tpot, "tokens": n}
        self.result = result
        return False


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return next(float(ln.split()[1]) for ln in text.splitlines() if ln.startswith(name + " "))


_REQUESTS = itertools.count()  # numbers every request of this process (all runs, both servers)


def run_clients(port, n, tokens, timeout, disconnect_every=0):
    """n streaming completions sent together, read by one thread through a selector, as an
    event-loop load generator reads them: a thread per client took the interpreter lock in
    turn for every line, on the cores the server runs on."""
    deadline = time.perf_counter() + timeout
    sel = selectors.DefaultSelector()
    t0 = time.perf_counter()
    clients = []
    for i in range(n):
        after = 4 if disconnect_every and i % disconnect_every == 0 else None
        try:
            c = Client(port, next(_REQUESTS), tokens, after)
        except OSError as e:
            clients.append(SimpleNamespace(result={"status": f"error {type(e).__name__}"}))
            continue
        clients.append(c)
        sel.register(c.sock, selectors.EVENT_READ, c)
    while sel.get_map() and (left := deadline - time.perf_counter()) > 0:
        for key, _ in sel.select(timeout=left):
            c = key.data
            try:
                data = c.sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError as e:
                data, c.result = None, {"status": f"error {type(e).__name__}"}
            if data is None or not c.feed(data, time.perf_counter()):
                sel.unregister(c.sock)
                c.sock.close()
    wall = time.perf_counter() - t0
    hung = len(sel.get_map())
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    sel.close()
    return [c.result for c in clients if c.result is not None], wall, hung


def load_row(capacity: int, clients: int, out: list, wall: float, hung: int) -> dict:
    ok = [r for r in out if r["status"] == 200]
    return {
        "capacity": capacity,
        "clients": clients,
        "served": len(ok),
        "refused_429": sum(r["status"] == 429 for r in out),
        "other": [r["status"] for r in out if r["status"] not in (200, 429)],
        "hung": hung,
        "wall_s": wall,
        "requests_per_s": len(ok) / wall,
        "output_tokens_per_s": sum(r["tokens"] for r in ok) / wall,
        "ttft_p50": pct([r["ttft"] for r in ok], 0.5),
        "ttft_p99": pct([r["ttft"] for r in ok], 0.99),
        "tpot_p50": pct([r["tpot"] for r in ok], 0.5),
        "tpot_p99": pct([r["tpot"] for r in ok], 0.99),
    }


def llama_server_row(
    clients, bin_dir: Path, gguf: Path, cap: int, tokens: int, timeout: float
) -> dict:
    """llama.cpp's server with C slots on the same C clients (after a warm-up request)."""
    with llama_server(bin_dir, gguf, cap, 256 * cap) as port:
        clients.apply(run_clients, (port, 1, 8, timeout))  # warm-up
        out, wall, hung = clients.apply(run_clients, (port, cap, tokens, timeout))
        return {"server": "llama-server", **load_row(cap, cap, out, wall, hung)}


def pct(values, q):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="C-client runs against bench")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run, at most")
    add_arguments(ap)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="serve_load", help="the results' file name")
    args = ap.parse_args()
    check_arguments(args)
    set_threads(torch.get_num_threads())
    bench, bench_runs, rounds, whole = {}, {}, {}, {}
    rows = []
    leak = {}
    spawn = multiprocessing.get_context("spawn")
    clients = spawn.Pool(1)  # the clients' own process
    with clients, tempfile.TemporaryDirectory() as tmp:
        art = Path(tmp) / "w4"
        recipe = parse_recipe({"stages": [parse_quant("rtn:w4g64zp")], "lm_head": "w8"})
        compress("default", recipe, art, log=lambda _: None)
        bencher = spawn.Pool(1, initializer=_bench_init, initargs=(str(art),))  # its own too
        for cap in [int(c) for c in args.capacities.split(",")]:
            app = build_app(str(art), max_batch=cap, max_len=256, max_queue=cap)
            clock = StepClock(app.scheduler)
            httpd = make_server(app, "127.0.0.1", 0)
            port = httpd.server_address[1]
            threading.Thread(target=httpd.serve_forever, daemon=True).start()
            clients.apply(run_clients, (port, 1, 8, args.timeout))  # warm-up
            benches = [bencher.apply(bench_tok_s, (cap, args.tokens))]
            runs = []
            for _ in range(args.rounds):  # C clients between two bench runs, each round
                clock.reset()
                out, wall, hung = clients.apply(run_clients, (port, cap, args.tokens, args.timeout))
                row = load_row(cap, cap, out, wall, hung)
                runs.append({"server": "llmpress", **row, "engine_s": clock.read()})
                benches.append(bencher.apply(bench_tok_s, (cap, args.tokens)))
                print(json.dumps({**runs[-1], "bench": benches[-2:]}), flush=True)
            wholes = [b["whole"] for b in benches]
            benches = [b["decode"] for b in benches]
            ratios = [
                r["output_tokens_per_s"] / ((a + b) / 2)
                for r, a, b in zip(runs, benches, benches[1:], strict=False)
            ]
            median = sorted(range(len(runs)), key=lambda i: ratios[i])[len(runs) // 2]
            rows.append(runs[median])
            bench[cap] = (benches[median] + benches[median + 1]) / 2
            whole[cap] = (wholes[median] + wholes[median + 1]) / 2
            bench_runs[cap] = benches[median : median + 2]
            rounds[cap] = ratios
            for mult in (2, 4):
                out, wall, hung = clients.apply(
                    run_clients, (port, cap * mult, args.tokens, args.timeout)
                )
                row = {"server": "llmpress", **load_row(cap, cap * mult, out, wall, hung)}
                rows.append(row)
                print(json.dumps(row), flush=True)
            if cap == max(int(c) for c in args.capacities.split(",")):
                out, _, hung = clients.apply(
                    run_clients, (port, cap * 2, args.tokens, args.timeout, 3)
                )
                time.sleep(1.0)
                leak = {
                    "capacity": cap,
                    "clients": cap * 2,
                    "disconnected": sum(r["status"] == "disconnected" for r in out),
                    "served": sum(r["status"] == 200 for r in out),
                    "refused_429": sum(r["status"] == 429 for r in out),
                    "hung": hung,
                    "running_after": metric(port, "llmpress_requests_running"),
                    "slots_in_use_after": metric(port, "llmpress_kv_cache_slots_in_use"),
                    "blocks_in_use_after": metric(port, "llmpress_kv_cache_blocks_in_use"),
                }
                print(json.dumps(leak), flush=True)
            httpd.shutdown()
            httpd.server_close()
            app.scheduler.stop()
            if args.llama_server:
                row = llama_server_row(
                    clients, args.llama_server, args.gguf, cap, args.tokens, args.timeout
                )
                rows.append(row)
                print(json.dumps(row), flush=True)
        bencher.terminate()
    ours = [r for r in rows if r["server"] == "llmpress"]
    single = next((r for r in ours if r["clients"] == 1), None)
    top = max((r for r in ours if r["clients"] == r["capacity"]), key=lambda r: r["capacity"])
    gain = top["output_tokens_per_s"] / single["output_tokens_per_s"] if single else None
    record = {
        "benchmark": "serve_load",
        "machine": {
            "platform": platform.platform(),
            "cpu": cpu_flags(),
            "threads": torch.get_num_threads(),
        },
        "tokens": args.tokens,
        "kv_cache": recipe.kv_cache,  # the artifact's, which serve and bench both run
        "rows": rows,
        "disconnect_run": leak,
        "batching_gain": {"streams": top["clients"], "vs_single": gain},
        "bench_tok_s": bench,
        "bench_tok_s_before_after": bench_runs,
        "served_vs_bench_rounds": rounds,
        "served_vs_bench": {
            r["capacity"]: r["output_tokens_per_s"] / bench[r["capacity"]]
            for r in ours
            if r["clients"] == r["capacity"]
        },
        "bench_whole_tok_s": whole,
        "served_vs_bench_whole": {
            r["capacity"]: r["output_tokens_per_s"] / whole[r["capacity"]]
            for r in ours
            if r["clients"] == r["capacity"]
        },
        "llama_server": None
        if not args.llama_server
        else f"{args.gguf.name} ({version(args.llama_server)}), -t 2 -tb 2",
        "llama_cflags": args.llama_cflags if args.llama_server else None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")
    (args.out / f"{args.name}.md").write_text(table(record) + "\n")
    print(table(record))


class StepClock:
    """Where the engine's thread spent a run: its steps' prefill and decode halves (and
    how many decode halves ran), and publishing each half's tokens, which includes
    writing the streams' events (the scheduler's pumps)."""

    def __init__(self, scheduler):
        self.seconds = {}
        engine = scheduler.engine
        for name in ("prefill_step", "decode_step", "_publish"):
            owner = scheduler if name == "_publish" else engine
            setattr(owner, name, self._timed(name, getattr(owner, name)))
        self.reset()

    def _timed(self, name, fn):
        def timed(*args):
            t = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds[name] += time.perf_counter() - t
                self.calls[name] += 1

        return timed

    def reset(self) -> None:
        self.seconds = dict.fromkeys(("prefill_step", "decode_step", "_publish"), 0.0)
        self.calls = dict.fromkeys(self.seconds, 0)

    def read(self) -> dict:
        s = self.seconds
        return {"prefill": s["prefill_step"], "decode": s["decode_step"],
                "publish": s["_publish"], "steps": self.calls["decode_step"]}  # fmt: skip


_BENCH: dict = {}


def _bench_init(artifact: str) -> None:
    """The bench process: the artifact loaded once, torch's threads for the kernels."""
    set_threads(torch.get_num_threads())
    ckpt = resolve(artifact)
    _BENCH.update(weights=load_weights(ckpt), kv=kv_scheme(None, ckpt.config))


def bench_tok_s(batch: int, tokens: int) -> dict:
    """`llmpress bench` at `batch` (prompts of 16 tokens, about the clients' prompt): its
    decode tok/s, and the whole batch's output tokens over the time from the prompts to
    the last token (every prompt prefilled in one step, then decoded): the work a served
    run's rate also counts, without the server."""
    record = run_bench(_BENCH["weights"], [batch], 16, tokens, _BENCH["kv"], lambda _: None)
    r = record["results"][0]
    seconds = r["ttft_s"] + (tokens - 1) * r["tpot_s"]
    return {"decode": r["tokens_per_s"], "whole": batch * tokens / seconds}


def table(record: dict) -> str:
    def ms(v):
        return "" if v is None else f"{1e3 * v:.0f}"

    lines = [
        "| server | capacity | clients | served | 429 | hung | req/s | out tok/s "
        "| TTFT p50/p99 ms | TPOT p50/p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        lines.append(
            f"| {r.get('server', 'llmpress')} | {r['capacity']} | {r['clients']} | {r['served']} | "
            f"{r['refused_429']} | "
            f"{r['hung']} | {r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.1f} | "
            f"{ms(r['ttft_p50'])}/{ms(r['ttft_p99'])} | {ms(r['tpot_p50'])}/{ms(r['tpot_p99'])} |"
        )
    g = record["batching_gain"]
    if g["vs_single"]:
        lines.append(
            f"\nAggregate output tokens/s at {g['streams']} concurrent streams: "
            f"{g['vs_single']:.1f}× a single stream (same run)."
        )
    for cap, ratio in (record.get("served_vs_bench") or {}).items():
        lines.append(
            f"{cap} streams served at {ratio:.2f}× `bench`'s batch-{cap} decode tok/s "
            f"({record['bench_tok_s'][cap]:.1f}: the mean of "
            f"{' and '.join(f'{v:.1f}' for v in record['bench_tok_s_before_after'][cap])}, "
            "run before and after; the median of "
            f"{', '.join(f'{v:.2f}' for v in record['served_vs_bench_rounds'][cap])})"
            + (
                f"; {record['served_vs_bench_whole'][cap]:.2f}× its whole-batch rate "
                f"({record['bench_whole_tok_s'][cap]:.1f}: prompts prefilled, then decoded)."
                if cap in (record.get("served_vs_bench_whole") or {})
                else "."
            )
        )
    leak = record["disconnect_run"]
    if leak:
        lines.append(
            f"Disconnect run: {leak['clients']} clients, {leak['disconnected']} left mid-stream; "
            f"afterwards running = {leak['running_after']:.0f}, KV slots in use = "
            f"{leak['slots_in_use_after']:.0f}, KV blocks in use = "
            f"{leak.get('blocks_in_use_after', float('nan')):.0f}."
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
