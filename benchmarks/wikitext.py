"""Where the benchmarks find WikiText-2 raw (beside the project root), and a loud stop
when it is missing: a benchmark never measures on something else silently."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "wikitext-2-raw"


def require(data: Path, *names: str) -> None:
    for name in names or ("valid.txt", "test.txt"):
        if not (data / name).is_file():
            raise SystemExit(f"wikitext-2 not found: {data / name}")


def default_model_windows(test: Path, ctx: int, windows: int):
    """The default model in fp32, its tokenizer's windows of `ctx` tokens over `test` (the
    first `windows`), and the checkpoint: what drift benchmarks compare candidates with."""
    from compress.artifact.dense import load_model
    from compress.calib_data import eval_windows, read_texts, token_stream
    from compress.model.loading import load_tokenizer, resolve

    if not test.is_file():
        raise SystemExit(f"evaluation text not found: {test}")
    ckpt = resolve("default")
    tokenizer = load_tokenizer(ckpt)
    stream = token_stream(tokenizer, read_texts(str(test)))
    return load_model(ckpt), eval_windows(stream, ctx, windows)
