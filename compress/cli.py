"""The `llmpress` command: parses, calls the library, prints; all of it callable from Python."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
from pathlib import Path

import click

from compress import __version__
from compress.artifact.formats import CODECS, DEFAULT, EXPORTS
from compress.errors import (
    EXIT_CRASH,
    EXIT_GATE,
    EXIT_INPUT,
    LlmpressError,
    explain_os_error,
    first_line,
)


def writable_parent(path: Path, what: str) -> None:
    """Create the folder `path` will be written into (as `mkdir -p`), before the work that
    produces it, or fail now in one line."""
    parent = Path(path).parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        known = explain_os_error(e, f"{what} {path}: cannot create {parent}")
        raise (known or LlmpressError(f"{what} {path}: cannot create {parent}")) from None
    if Path(path).is_dir():
        raise LlmpressError(f"{what} {path} is a folder: name a file")


def check_threads(threads: int | None) -> None:
    if threads is not None and threads < 1:
        raise LlmpressError(f"--threads {threads}: give at least 1 (or leave it out)")


def _command_line() -> str:
    return "llmpress " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="llmpress")
def cli() -> None:
    """Make a language model smaller and faster, and prove what that cost in quality."""


@cli.command()
@click.argument("model")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="Folder to write the artifact to (must not exist unless --overwrite).",
)
@click.option(
    "--recipe",
    "recipe_file",
    type=click.Path(path_type=Path),
    help="Recipe YAML: an ordered list of stages.",
)
@click.option(
    "--quant",
    "quant",
    help="Shorthand: w4g64 (the fast preset: GPTQ with searched scales, 16 samples), "
    "best:w4g64 (mixed → gptq → distill, 64 samples), awq:w4g64, gptq:w4g64, rtn:w4g64, "
    "rtn:w8 (per-channel), int8.",
)
@click.option("--calib", help="Calibration text: .txt/.jsonl/.parquet, a dataset name, or `self`.")
@click.option("--calib-samples", type=int, help="Number of calibration samples (default 128).")
@click.option("--calib-len", type=int, help="Tokens per calibration sample (default 512).")
@click.option("--text-field", help="Text field of .jsonl/.parquet/dataset rows (default: text).")
@click.option(
    "--dtype",
    type=click.Choice(["auto", "auto16", "float32", "bfloat16", "float16"]),
    help="Storage dtype of unquantized tensors and scales (default: the source's; best:* "
    "presets: auto16, the source's if 16-bit, else bfloat16).",
)
@click.option(
    "--ignore",
    multiple=True,
    help="Leave matching linears unquantized (glob or re:REGEX; repeatable).",
)
@click.option(
    "--export",
    type=click.Choice([e for e in EXPORTS if e != DEFAULT]),
    help=f"Artifact layout (default: {CODECS[DEFAULT].summary}). "
    + "; ".join(f"{e}: {CODECS[e].summary}" for e in EXPORTS if e != DEFAULT),
)
@click.option(
    "--lm-head",
    help="Output projection: a scheme (RTN, e.g. w8 or w4g64), none (keep as stored), or auto "
    "(the default: w8 when the model's head is untied and the blocks are quantized).",
)
@click.option(
    "--bits",
    type=float,
    help="Mixed precision: average bits per weight (scales included) to spend, e.g. 4.6; "
    "the most sensitive linears get smaller groups or 8 bits.",
)
@click.option(
    "--kv",
    "kv_cache",
    help="KV-cache scheme the artifact records for the runtime: int8 (default), int4, none.",
)
@click.option(
    "--target",
    "targets",
    multiple=True,
    type=click.Choice(["vllm", "vllm-cpu", "transformers"]),
    help="An engine the artifact must load in (repeatable): mixed precision and the lm_head "
    "keep to what it runs, and a recipe it would refuse is refused before any work.",
)
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder.")
@click.option(
    "--resume",
    is_flag=True,
    help="Continue an interrupted run's distillation from its last checkpoint.",
)
@click.option(
    "--device",
    default="auto",
    show_default=True,
    help="Where blocks, calibration and searches run: auto (a GPU when torch sees one), cpu, "
    "cuda or cuda:N.",
)
def compress(
    model,
    output,
    recipe_file,
    quant,
    calib,
    calib_samples,
    calib_len,
    text_field,
    dtype,
    ignore,
    export,
    lm_head,
    bits,
    kv_cache,
    targets,
    overwrite,
    resume,
    device,
):
    """Compress MODEL (a folder, a .gguf file, a hub id, or `default`) into an artifact."""
    from compress import distributed
    from compress.allocator import return_freed_memory
    from compress.pipeline import compress as run
    from compress.recipe import recipe_from_flags

    return_freed_memory()  # memory stays one block, not a heap of every block's
    calib_flags = {
        "source": calib,
        "samples": calib_samples,
        "length": calib_len,
        "text_field": text_field,
    }
    flags = {"dtype": dtype, "export": export, "lm_head": lm_head, "kv_cache": kv_cache}
    recipe = recipe_from_flags(recipe_file, quant, calib_flags, flags, ignore, bits, targets)
    run(
        model,
        recipe,
        output,
        overwrite=overwrite,
        resume=resume,
        command=_command_line(),
        log=click.echo,
        device=device,
    )
    distributed.stop()  # under torchrun: leave the process group


@cli.command("eval")
@click.argument("artifact")
@click.option("--base", help="The original model (default: the source named in the manifest).")
@click.option(
    "--data",
    default="self",
    show_default=True,
    help="Evaluation text: .txt/.jsonl/.parquet, a dataset name, or `self`.",
)
@click.option("--ctx", default=512, show_default=True, help="Tokens per window.")
@click.option(
    "--windows", default=64, show_default=True, help="Evaluate the first N windows (0: all)."
)
@click.option("--text-field", default="text", show_default=True)
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write results as JSON.")
@click.option("--gate", help="Fail (exit 1) unless every test holds, e.g. 'kl<=0.05,top1>=0.9'.")
@click.option(
    "--gate-file",
    type=click.Path(path_type=Path),
    help="YAML of thresholds per metric, absolute (max/min) or relative to the original.",
)
@click.option(
    "--report",
    "report_dir",
    type=click.Path(path_type=Path),
    help="Write report.md, report.json and PNG plots into this folder.",
)
@click.option("--no-record", is_flag=True, help="Do not write the drift into the manifest.")
@click.option(
    "--engine",
    type=click.Choice(["runtime", "transformers"]),
    default="runtime",
    show_default=True,
    help="Run the artifact through llmpress's runtime, or load it with transformers.",
)
@click.option(
    "--kv", help="KV-cache scheme for the runtime: int8, int4, none (default: artifact's)."
)
@click.option(
    "--exact",
    is_flag=True,
    help="Measure (and gate) the weights alone: fp32 activations, dequantized weights. By "
    "default the runtime measures what bench and serve run (int8 activations on CPU), with "
    "the exact figure beside it.",
)
def eval_cmd(
    artifact,
    base,
    data,
    ctx,
    windows,
    text_field,
    json_out,
    gate,
    gate_file,
    report_dir,
    no_record,
    engine,
    kv,
    exact,
):
    """Measure ARTIFACT's quality drift against the original; gate it; report it."""
    from compress.allocator import return_freed_memory
    from compress.artifact.manifest import read_manifest
    from compress.eval.drift import drift_rows, format_table
    from compress.eval.gates import check_gates
    from compress.eval.report import layer_errors, size_metrics, write_report
    from compress.eval.run import evaluate
    from compress.model.loading import resolve

    return_freed_memory()  # the original walks block by block
    gates = _eval_preflight(gate, gate_file, ctx, windows, json_out, report_dir)
    base_is_source = _check_eval_models(artifact, base, ctx)
    token_kl: dict | None = {} if report_dir else None
    drift = evaluate(
        artifact,
        base,
        data,
        ctx,
        windows or None,
        text_field,
        record=False,  # after the results are out: a read-only artifact still gets them
        log=click.echo,
        engine=engine,
        kv=kv,
        token_kl=token_kl,
        exact=exact,
    )
    cand = resolve(artifact)
    manifest = read_manifest(cand.path)
    base_ckpt = resolve(base or manifest["source"]["source"])
    sizes = size_metrics(cand, base_ckpt, manifest)
    click.echo(format_table(drift_rows(artifact, drift)))
    verdicts = check_gates(gates, {**drift.metrics(), **sizes})
    for v in verdicts:
        click.echo(f"gate {v.line()}")
    if report_dir:
        write_report(
            report_dir,
            artifact=artifact,
            drift=drift,
            token_kl=token_kl.get("artifact"),
            sizes=sizes,
            errors=layer_errors(cand, base_ckpt),
            manifest=manifest,
            verdicts=verdicts,
            command=_command_line(),
        )
        click.echo(f"report written to {report_dir / 'report.md'}")
    failed = [v for v in verdicts if not v.passed]
    if json_out:
        _write_eval_json(json_out, artifact, drift, sizes, verdicts, base_is_source)
    if not no_record and manifest is not None:
        _record(cand.path, manifest, drift, base or manifest["source"]["source"], engine, kv)
    if failed:
        names = ", ".join(v.gate.metric for v in failed)
        click.echo(f"quality gate failed: {names}", err=True)
        sys.exit(EXIT_GATE)


def _record(folder: Path, manifest: dict, drift, base: str, engine: str, kv) -> None:
    """Record the drift in the manifest; where that cannot be written, say so after the
    results and verdicts, which stand."""
    from compress.eval.run import record_drift

    try:
        record_drift(folder, manifest, drift, base, engine, kv)
    except OSError as e:
        why = e.strerror or type(e).__name__
        click.echo(
            f"warning: could not record the drift in {folder / 'manifest.json'} ({why}); the "
            "results above stand: pass --no-record to skip recording",
            err=True,
        )


def _eval_preflight(gate, gate_file, ctx, windows, json_out, report_dir) -> list:
    """The gates, and every refusal of bad input, before an hour of evaluation."""
    from compress.eval.gates import load_gate_file, parse_gates

    gates = parse_gates(gate) if gate is not None else []
    gates += load_gate_file(gate_file) if gate_file else []
    if ctx < 2:
        raise LlmpressError(f"--ctx {ctx}: a window needs at least 2 tokens (e.g. 512)")
    if windows < 0:
        raise LlmpressError(f"--windows {windows}: give a count >= 1, or 0 for all windows")
    for path, what in ((json_out, "--json"), (report_dir and report_dir / "report.md", "--report")):
        if path is not None:
            writable_parent(path, what)
    return gates


def _check_eval_models(artifact: str, base: str | None, ctx: int) -> bool | None:
    """Refuse windows past the artifact's context, and warn in one line when `--base` is
    not the model the artifact was made from (its manifest records that model's sha256):
    the drift is then against another model. Whether it is (None: nothing to compare)."""
    from compress.artifact.manifest import read_manifest
    from compress.model.loading import check_context, resolve

    cand = resolve(artifact)
    check_context(cand, ctx, "--ctx")
    source = (read_manifest(cand.path) or {}).get("source")
    recorded = source.get("sha256") if isinstance(source, dict) else None
    if base is None or not isinstance(recorded, str):
        return None
    if resolve(base).sha256 == recorded:
        return True
    click.echo(
        f"warning: --base {base} is not the model {artifact} was made from ({source.get('name')}, "
        f"sha256 {recorded[:12]}...): the drift compares it with another model",
        err=True,
    )
    return False


def _write_eval_json(
    path: Path, artifact: str, drift, sizes: dict, verdicts: list, base_is_source: bool | None
) -> None:
    result = {
        "artifact": artifact,
        **drift.to_dict(),
        "base_is_source": base_is_source,
        **sizes,
        "gates": [v.to_dict() for v in verdicts],
        "passed": all(v.passed for v in verdicts),
    }
    from compress.artifact.manifest import portable

    write_json(path, portable(result))  # paths relative to here, as the manifest has them


def write_json(path: Path, data: dict) -> None:
    """Write results as strict JSON: a NaN or infinity, which strict parsers reject, is
    refused in one line instead of written."""
    try:
        text = json.dumps(data, indent=2, allow_nan=False)
    except ValueError:
        raise LlmpressError(
            f"{path}: a result is NaN or infinite, which strict JSON cannot hold; nothing "
            "was written there"
        ) from None
    path.write_text(text + "\n")


@cli.command()
@click.argument("artifact", type=click.Path(path_type=Path))
@click.option("--repo", required=True, help="Hub repo id to create or update: ORG/NAME.")
@click.option("--private", is_flag=True, help="Create the repo private.")
@click.option("--dry-run", is_flag=True, help="Print the files and the model card; upload nothing.")
def push(artifact, repo, private, dry_run):
    """Publish ARTIFACT to the Hugging Face Hub with a model card made from its manifest."""
    from compress.hub.push import push as run

    run(artifact, repo, private=private, dry_run=dry_run, log=click.echo)


@cli.command()
@click.argument("artifact", type=click.Path(path_type=Path))
def verify(artifact):
    """Check every file of ARTIFACT against the sha256 its manifest recorded."""
    from compress.artifact.integrity import file_hashes, problems

    if not artifact.is_dir():
        what = "is a file, not" if artifact.exists() else "does not exist: pass"
        raise LlmpressError(f"{artifact} {what} an artifact folder (what `compress -o` wrote)")
    found = problems(artifact)
    if found:
        for line in found:
            click.echo(f"FAIL {line}")
        sys.exit(EXIT_GATE)
    click.echo(f"ok: {len(file_hashes(artifact))} files match {artifact / 'manifest.json'}")


@cli.command()
@click.argument("artifact")
@click.option(
    "--batch", "batches", default="1,8,32", show_default=True, help="Batch sizes, comma-separated."
)
@click.option("--prompt-len", default=32, show_default=True, help="Prompt tokens per sequence.")
@click.option("--output-len", default=128, show_default=True, help="Generated tokens per sequence.")
@click.option("--kv", help="KV-cache scheme: int8, int4, none (default: the artifact's).")
@click.option("--threads", type=int, help="CPU threads (default: torch's choice).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), help="Write results as JSON.")
@click.option(
    "--draft",
    help="Speculative decoding while one sequence runs: `ngram` (prompt lookup) or a draft "
    "artifact with the target's tokenizer; greedy output is unchanged.",
)
@click.option(
    "--sweep",
    type=click.Path(path_type=Path),
    help="Instead: sweep batch 1-64 and context 128-4096 and write roofline.json and "
    "roofline.png (achieved GB/s and GFLOP/s against measured ceilings) into this folder.",
)
def bench(artifact, batches, prompt_len, output_len, kv, threads, json_out, draft, sweep):
    """Decode speed of ARTIFACT in llmpress's runtime: TTFT, time per token, tokens/s, MBU."""

    from compress.kernels.cpu import set_threads
    from compress.model.loading import check_context, resolve
    from compress.runtime.bench import format_bench, run_bench
    from compress.runtime.kv_cache import kv_scheme
    from compress.runtime.speculative import check_draft_vocabulary
    from compress.runtime.weights import load_weights

    try:
        sizes = [int(b) for b in batches.split(",")]
    except ValueError:
        raise LlmpressError(f"--batch {batches!r}: give sizes like 1,8,32") from None
    if not sizes or min(sizes) < 1 or max(sizes) > 1024:
        raise LlmpressError(f"--batch {batches!r}: each size must be from 1 to 1024")
    if prompt_len < 1 or output_len < 2:
        raise LlmpressError(
            f"--prompt-len {prompt_len} --output-len {output_len}: a prompt needs >= 1 token "
            "and the decode timing >= 2 generated tokens"
        )
    if json_out is not None:
        writable_parent(json_out, "--json")
    if sweep is not None:
        if sweep.exists() and not sweep.is_dir():
            raise LlmpressError(f"--sweep {sweep} is a file: name a folder for the roofline")
        writable_parent(sweep / "roofline.json", "--sweep")
    check_threads(threads)
    set_threads(threads)
    ckpt = resolve(artifact)
    check_context(ckpt, prompt_len + output_len, "--prompt-len + --output-len")
    check_draft_vocabulary(draft, ckpt.config)
    weights = load_weights(ckpt)
    scheme = kv_scheme(kv, ckpt.config)
    for note in weights.dense_fallbacks:
        click.echo(f"note: runs dense: {note}")
    if sweep is not None:
        return _roofline(weights, scheme, artifact, sweep)
    record = run_bench(weights, sizes, prompt_len, output_len, scheme, click.echo, draft)
    record["artifact"] = artifact
    click.echo(format_bench(record))
    if json_out:
        write_json(json_out, record)


def _roofline(weights, scheme, artifact: str, folder: Path) -> None:
    from compress.runtime.roofline import format_sweep, plot_roofline, sweep

    record = sweep(weights, scheme, log=click.echo)
    record["artifact"] = artifact
    title = f"{Path(artifact).name}: decode, KV {f'int{scheme.bits}' if scheme.bits else 'fp32'}"
    plot_roofline(record, folder / "roofline.png", title)
    (folder / "roofline.json").write_text(json.dumps(record, indent=2) + "\n")
    click.echo(format_sweep(record))
    click.echo(f"wrote {folder / 'roofline.json'} and {folder / 'roofline.png'}")


@cli.command()
@click.argument("artifact")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=int)
@click.option("--max-batch", default=8, show_default=True, help="Sequences decoded together.")
@click.option(
    "--max-len", type=int, help="Context per sequence (default: 2048, or the model's if shorter)."
)
@click.option("--max-queue", default=64, show_default=True, help="Waiting requests before 429.")
@click.option("--kv", help="KV-cache scheme: int8, int4, none (default: the artifact's).")
@click.option("--threads", type=int, help="CPU threads (default: torch's choice).")
@click.option("--model-name", help="Name in /v1/models (default: the artifact folder's name).")
@click.option(
    "--draft",
    help="Speculative decoding while one sequence runs: `ngram` (prompt lookup) or a draft "
    "artifact with the target's tokenizer; greedy output is unchanged.",
)
@click.option(
    "--api-key",
    envvar="LLMPRESS_API_KEY",
    help="Require `Authorization: Bearer KEY` on /v1 and /metrics (env LLMPRESS_API_KEY).",
)
@click.option(
    "--max-connections", default=256, show_default=True, help="Open connections before 503."
)
@click.option(
    "--prefill-tokens",
    type=int,
    help="Prompt tokens prefilled per step for each running stream held back (k budgets "
    "where k times as many prompts wait as streams decode); longer prompts go in chunks "
    "between decode steps (default: the engine's measured budget, docs/serving.md).",
)
@click.option(
    "--prefix-cache-mb",
    type=int,
    help="MB of prompt-prefix k/v kept so that requests sharing a prompt's start skip "
    "prefilling it (default: 1024; 0 turns the prefix cache off).",
)
@click.option(
    "--kv-tokens",
    type=int,
    help="Tokens the KV cache holds, all sequences together, in blocks taken as sequences "
    "grow; a request is admitted when its prompt and max_tokens fit what is free "
    "(default: max-batch x max-len).",
)
def serve(artifact: str, **options) -> None:
    """Serve ARTIFACT over an OpenAI-compatible HTTP API on the decode runtime."""
    from compress.serve.app import run_server
    from compress.serve.server import check_api_key, is_loopback

    batch, max_len, queue = options["max_batch"], options["max_len"], options["max_queue"]
    if batch < 1 or (max_len is not None and max_len < 2) or queue < 0:
        raise LlmpressError(
            f"--max-batch {batch} --max-len {max_len} --max-queue {queue}: the batch "
            "needs >= 1 sequence, the context >= 2 tokens, the queue >= 0 requests"
        )
    if not 0 <= options["port"] <= 65535:
        raise LlmpressError(f"--port {options['port']}: give a port from 0 to 65535")
    if options["prefill_tokens"] is not None and options["prefill_tokens"] < 1:
        raise LlmpressError(f"--prefill-tokens {options['prefill_tokens']}: give 1 or more")
    if options["max_connections"] < 1:
        raise LlmpressError(f"--max-connections {options['max_connections']}: give 1 or more")
    if options["prefix_cache_mb"] is not None and options["prefix_cache_mb"] < 0:
        raise LlmpressError(f"--prefix-cache-mb {options['prefix_cache_mb']}: give 0 (off) or more")
    if options["kv_tokens"] is not None and options["kv_tokens"] < 1:
        raise LlmpressError(f"--kv-tokens {options['kv_tokens']}: give 1 or more")
    check_api_key(options["api_key"])
    check_threads(options["threads"])
    if not options["api_key"] and not is_loopback(options["host"]):
        click.echo(
            f"warning: --host {options['host']} without --api-key: anyone who can reach this "
            "port can use the server; set --api-key or LLMPRESS_API_KEY",
            err=True,
        )
    stopped_by = run_server(artifact, log=click.echo, **options)
    if stopped_by is not None:  # drained: exit as the signal would have (SIGTERM 143)
        sys.exit(128 + stopped_by)


@cli.command()
@click.argument("artifact")
@click.option("--json", "as_json", is_flag=True, help="Print the manifest as JSON.")
def inspect(artifact, as_json):
    """Describe ARTIFACT: source, recipe, layers, sizes and recorded drift."""
    from compress.inspect import describe

    click.echo(describe(artifact, as_json=as_json))


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so `finally` and cleanup run."""


_TERMINATED = []  # set once SIGTERM arrived


def _terminate(signum, frame):
    _TERMINATED.append(signum)
    raise Terminated()


def _crash_report(exc: BaseException) -> str:
    """Write the traceback of an unexpected error to a file; return the file's path."""
    import tempfile
    import traceback

    fd, path = tempfile.mkstemp(prefix="llmpress-crash-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(_command_line() + "\n\n")
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=f)
    return path


def _usage_line(e: click.UsageError) -> str:
    """A bad flag, value or command as one line with where to look, instead of click's
    usage block (CI logs and scripts read one line)."""
    message = " ".join(e.format_message().split())
    command = e.ctx.command_path if e.ctx is not None else "llmpress"
    if e.ctx is not None and e.ctx.command is cli and "No such command" in message:
        message += f" Commands: {', '.join(sorted(cli.commands))}."
    return f"{message} (see `{command} --help`)"


def main() -> None:
    """Run the CLI. Exit codes: 0 ok, 1 gate or verify failed, 2 bad input (one line),
    3 internal error (one line; the traceback goes to a file, or to stderr with
    LLMPRESS_DEBUG=1)."""
    signal.signal(signal.SIGTERM, _terminate)  # unwind, so temporary folders are removed
    try:
        cli(standalone_mode=False, prog_name="llmpress")
    except Terminated:
        click.echo("terminated: nothing was written", err=True)
        sys.exit(143)
    except LlmpressError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_INPUT)
    except click.exceptions.Abort as e:  # click turns KeyboardInterrupt into Abort
        if isinstance(e.__context__, Terminated):
            click.echo("terminated: nothing was written", err=True)
            sys.exit(143)
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.exceptions.NoArgsIsHelpError as e:  # bare `llmpress`: the help, as asked
        e.show()
        sys.exit(EXIT_INPUT)
    except click.UsageError as e:
        click.echo(f"error: {_usage_line(e)}", err=True)
        sys.exit(EXIT_INPUT)
    except click.ClickException as e:
        e.show()
        sys.exit(EXIT_INPUT if e.exit_code == 2 else e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted: nothing was written", err=True)
        sys.exit(130)
    except Exception as e:
        if _TERMINATED:  # raised inside native code (e.g. safetensors), which surfaced
            click.echo("terminated: nothing was written", err=True)  # its own error
            sys.exit(143)
        if os.environ.get("LLMPRESS_DEBUG"):
            raise
        known = explain_os_error(e, "llmpress " + (sys.argv[1] if len(sys.argv) > 1 else ""))
        if known is not None:
            click.echo(f"error: {known}", err=True)
            sys.exit(EXIT_INPUT)
        first = first_line(e)
        click.echo(
            f"internal error: {type(e).__name__}: {first} (a bug in llmpress; traceback in "
            f"{_crash_report(e)}, or rerun with LLMPRESS_DEBUG=1)",
            err=True,
        )
        sys.exit(EXIT_CRASH)
