"""`eval --report DIR`: report.md, report.json and PNG plots of what compression cost.

Plots are meant to be read at a glance: every axis titled with its unit, the original
model drawn as the reference (a line at its value, or 0 error). Which plots appear
depends on the recipe: outlier channels when LLM.int8() ran, importance when pruning ran.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from compress.artifact.manifest import portable
from compress.calib_data.sources import data_name
from compress.eval.drift import Drift
from compress.methods import STAGES
from compress.model.adapters import LLAMA

# block linears in execution order, by their last name (the adapters share llama's names)
KINDS_ORDER = tuple(n.rsplit(".", 1)[-1] for n in LLAMA.block_linears)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"figure.dpi": 110, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def size_metrics(artifact_ckpt, base_ckpt, manifest: dict | None) -> dict[str, float]:
    """Size on disk and bits per stored weight, of the artifact and of the original."""

    def params(ckpt) -> int:
        total = 0
        for _, shape, _ in ckpt.tensors.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    size = sum(f.stat().st_size for f in artifact_ckpt.files)
    base = sum(f.stat().st_size for f in base_ckpt.files)
    a_params = (manifest or {}).get("weights", {}).get("parameters") or params(artifact_ckpt)
    return {
        "size_mb": size / 1e6,
        "base_size_mb": base / 1e6,
        "bits_per_weight": 8 * size / a_params,
        "base_bits_per_weight": 8 * base / params(base_ckpt),
    }


def layer_errors(artifact_ckpt, base_ckpt) -> dict[str, float]:
    """Relative weight error ‖Ŵ − W‖ / ‖W‖ of every quantized linear whose shape the
    original shares (a pruned layer has no original of its shape to compare with).

    AWQ stores W·diag(s) and folds 1/s into the op before it, so a stored weight is
    compared after dividing each input column by its fitted scale: the error then
    measures quantization, not the (lossless) rescaling."""
    from compress.artifact.reader import dense_state_dict
    from compress.model.loading import read_tensors

    dense = dense_state_dict(artifact_ckpt)
    wanted = [n for n, t in dense.items() if t.dim() == 2 and n in base_ckpt.tensors]
    out = {}
    for name in wanted:
        original = read_tensors(base_ckpt, [name])[name].float()
        new = dense[name].float()
        if new.shape != original.shape:
            continue
        new = new / column_scale(new, original)
        err = float((new - original).norm() / original.norm().clamp_min(1e-12))
        if err > 0:
            out[name[: -len(".weight")]] = err
    return out


def column_scale(new: torch.Tensor, original: torch.Tensor) -> torch.Tensor:
    """Least-squares s_j with new[:, j] ≈ s_j · original[:, j]; 1 where a column is zero
    or the fit is not positive (then there is no rescaling to undo)."""
    dot = (new * original).sum(0)
    sq = (original * original).sum(0)
    s = dot / sq.clamp_min(1e-30)
    return torch.where((sq > 0) & (s > 0), s, torch.ones_like(s))


def _by_layer(values: dict[str, float]) -> dict[str, dict[int, float]]:
    """{"model.layers.3.mlp.down_proj": v} → {"down_proj": {3: v}}."""
    out: dict[str, dict[int, float]] = {}
    for name, v in values.items():
        m = re.search(r"\.(\d+)\.(?:[a-z_]+\.)*([a-z_]+)$", name)
        if m:
            out.setdefault(m.group(2), {})[int(m.group(1))] = v
    return dict(sorted(out.items(), key=lambda kv: _kind_rank(kv[0])))


def _kind_rank(kind: str) -> int:
    return KINDS_ORDER.index(kind) if kind in KINDS_ORDER else len(KINDS_ORDER)


def plot_drift(path: Path, drift: Drift, name: str) -> None:
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.6))
    a.bar(["original", name], [drift.base_ppl, drift.ppl], color=["#999999", "#3b75af"])
    a.axhline(drift.base_ppl, color="black", ls="--", lw=1, label="original")
    a.set_ylabel("perplexity (lower is better)")
    a.set_title(f"Perplexity on {data_name(drift.data)}")
    for bars, fmt in ((a.containers[0], "{:.2f}"),):
        a.bar_label(bars, labels=[fmt.format(v) for v in (drift.base_ppl, drift.ppl)])
    a.legend(loc="lower right")
    b.bar(["original", name], [1.0, drift.top1], color=["#999999", "#3b75af"])
    b.axhline(1.0, color="black", ls="--", lw=1, label="original (agrees with itself)")
    b.set_ylim(min(0.5, drift.top1 - 0.05), 1.02)
    b.set_ylabel("top-1 agreement (fraction of tokens)")
    b.bar_label(b.containers[0], labels=["1", f"{drift.top1:.4f}"])
    b.set_title(f"Top-1 agreement; KL {drift.kl:.4f} nats/token")
    b.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_token_kl(path: Path, kl: torch.Tensor) -> None:
    plt = _plt()
    values = kl.clamp_min(1e-8).double().numpy()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    bins = torch.logspace(-8, max(1.0, float(torch.tensor(values).max().log10()) + 0.1), 60)
    ax.hist(values, bins=bins.numpy(), color="#3b75af")
    ax.set_xscale("log")
    mean, median = float(values.mean()), float(torch.tensor(values).median())
    ax.axvline(mean, color="#d62728", lw=1.5, label=f"mean {mean:.4f}")
    ax.axvline(median, color="black", ls="--", lw=1, label=f"median {median:.2g}")
    ax.set_xlabel("KL(original ‖ compressed) per token [nats] (the original: 0)")
    ax.set_ylabel("tokens")
    ax.set_title(f"Per-token KL divergence, {len(values):,} tokens")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_per_layer(
    path: Path,
    series: dict[str, dict[int, float]],
    ylabel: str,
    title: str,
    percent: bool = False,
    zero_label: str = "original",
) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for kind, points in series.items():
        xs = sorted(points)
        ys = [points[x] * (100 if percent else 1) for x in xs]
        ax.plot(xs, ys, marker="o", ms=3, lw=1.2, label=kind)
    ax.axhline(0, color="black", ls="--", lw=1, label=zero_label)
    ax.set_xlabel("layer (block index)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_pruning(path: Path, record: dict) -> None:
    """Layer scores (removed layers marked), head importance, hidden-channel importance."""
    plt = _plt()
    imp, kept = record["importance"], record["kept"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    a = axes[0]
    layers = list(range(len(imp["layer_block_influence"])))
    a.plot(layers, imp["layer_block_influence"], marker="o", ms=3, label="block influence 1−cos")
    if imp.get("layer_removal_kl"):
        a.plot(layers, imp["layer_removal_kl"], marker="s", ms=3, label="KL when removed")
    removed = [i for i in layers if i not in set(kept["layers"])]
    for i in removed:
        a.axvspan(i - 0.5, i + 0.5, color="#d62728", alpha=0.2)
    a.axhline(0, color="black", ls="--", lw=1, label="no effect")
    a.set_yscale("symlog", linthresh=1e-3)
    a.set_xlabel("layer (original index); red: removed")
    a.set_ylabel("importance [nats or 1−cos]")
    a.set_title("Layer importance")
    a.legend(fontsize=8)
    b = axes[1]
    if record["shape_after"].get("attention"):  # latent attention: no head was scored
        b.text(0.5, 0.5, "heads kept whole\n(latent attention)", ha="center", va="center")
        b.set_axis_off()
    else:
        heads = torch.tensor(imp["heads"])
        shown = b.imshow(heads.T.numpy(), aspect="auto", cmap="viridis")
        b.set_xlabel("layer (original index)")
        b.set_ylabel("query head")
        b.set_title("Head importance (RMS contribution norm)")
        fig.colorbar(shown, ax=b, label="RMS ‖head output · W_o‖")
    c = axes[2]
    # per layer [width], or [experts, width]; a Mixture-of-Experts model's dense layers
    # (GLM-4.5's first) hold a [width] of their own width among its [experts, width]
    rows = [r for layer in imp["mlp"] for r in (layer if isinstance(layer[0], list) else [layer])]
    for width in sorted({len(r) for r in rows}, reverse=True):
        mlp = torch.tensor([r for r in rows if len(r) == width])
        mlp = mlp.sort(dim=1, descending=True).values.mean(0)
        c.plot(mlp.numpy(), label=f"MLP neurons of {width} (mean)")
    hidden = torch.tensor(imp["hidden"]).sort(descending=True).values
    c.plot(hidden.numpy(), label="hidden channels")
    after = record["shape_after"]
    c.axvline(after["intermediate"], color="#3b75af", ls=":", label="MLP kept")
    c.axvline(after["hidden"], color="#ff7f0e", ls=":", label="hidden kept")
    c.set_yscale("log")
    c.set_xlabel("rank (most important first)")
    c.set_ylabel("importance (RMS contribution)")
    c.set_title("Width importance, sorted")
    c.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_report(
    folder: Path,
    *,
    artifact: str,
    drift: Drift,
    token_kl: torch.Tensor | None,
    sizes: dict[str, float],
    errors: dict[str, float],
    manifest: dict | None,
    verdicts: list | None = None,
    command: str | None = None,
) -> Path:
    """Write report.md, report.json and the plots into `folder` (created if needed)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = Path(artifact).name or artifact
    stages = (manifest or {}).get("stages", [])
    images = _plots(folder, name, drift, token_kl, errors, stages)
    quant = _kl_quantiles(token_kl)
    report = portable(  # a report is shared: paths relative to here, never this machine's
        {
            "artifact": artifact,
            "recipe": (manifest or {}).get("label"),
            "command": command,
            "drift": drift.to_dict(),
            "sizes": sizes,
            "token_kl_quantiles": quant,
            "layer_error": errors,
            "gates": [v.to_dict() for v in verdicts or []],
            "images": [f for _, f in images],
        }
    )
    command = report["command"]
    (folder / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = _summary(name, report, drift, sizes, quant, errors, verdicts)
    for title, file in images:
        lines += [f"## {title}", "", f"![{title}]({file})", ""]
    if command:
        lines += ["Made with:", "", "```", command, "```", ""]
    (folder / "report.md").write_text("\n".join(lines))
    return folder


def _plots(folder, name, drift, token_kl, errors, stages) -> list[tuple[str, str]]:
    """The report's figures, each as (title, file)."""
    images = [("Quality against the original", "drift.png")]
    plot_drift(folder / "drift.png", drift, name)
    if token_kl is not None:
        plot_token_kl(folder / "token_kl.png", token_kl)
        images.append(("Distribution of per-token KL", "token_kl.png"))
    if errors:
        plot_per_layer(
            folder / "layer_error.png",
            _by_layer(errors),
            "relative weight error ‖Ŵ−W‖/‖W‖ [%]",
            "Per-layer quantization error",
            percent=True,
            zero_label="original (0%)",
        )
        images.append(("Per-layer quantization error", "layer_error.png"))
    for record in stages:  # what each stage asks to show of its record
        entry = STAGES.get(record.get("stage"))
        for fig in entry.factory.figures(record) if entry else []:
            if fig.kind == "per_layer":
                plot_per_layer(
                    folder / fig.file,
                    _by_layer(fig.data),
                    fig.ylabel,
                    fig.plot_title or fig.title,
                    zero_label=fig.zero_label,
                )
            elif fig.kind == "pruning":
                plot_pruning(folder / fig.file, fig.data)
            else:
                continue
            images.append((fig.title, fig.file))
    return images


def _kl_quantiles(token_kl: torch.Tensor | None) -> dict[str, float]:
    if token_kl is None:
        return {}
    q = torch.quantile(token_kl.double(), torch.tensor([0.5, 0.9, 0.99]).double())
    return dict(zip(["p50", "p90", "p99"], q.tolist(), strict=True))


def _summary(name, report, drift, sizes, quant, errors, verdicts) -> list[str]:
    """report.md up to the figures: the drift table, KL tail, worst layers, gates."""
    lines = [
        f"# llmpress report: {name}",
        "",
        f"Recipe: `{report['recipe'] or 'unknown'}`. Evaluated on {data_name(drift.data)} "
        f"({drift.windows} windows × {drift.ctx} tokens, {drift.tokens:,} scored tokens).",
        "",
        "| | perplexity | KL (nats/token) | top-1 agreement | weights on disk | bits/weight |",
        "|---|---|---|---|---|---|",
        f"| original | {drift.base_ppl:.3f} | 0 | 1 | {sizes['base_size_mb']:.1f} MB | "
        f"{sizes['base_bits_per_weight']:.2f} |",
        f"| {name} | {drift.ppl:.3f} | {drift.kl:.5f} | {drift.top1:.4f} | "
        f"{sizes['size_mb']:.1f} MB | {sizes['bits_per_weight']:.2f} |",
        "",
    ]
    if quant:
        lines += [
            f"Per-token KL: median {quant['p50']:.2g}, 90th percentile {quant['p90']:.3g}, "
            f"99th percentile {quant['p99']:.3g}.",
            "",
        ]
    if errors:
        worst = sorted(errors.items(), key=lambda kv: -kv[1])[:3]
        lines += [
            "Largest per-layer weight errors: "
            + ", ".join(f"`{k}` {v:.2%}" for k, v in worst)
            + ".",
            "",
        ]
    if verdicts:
        lines += ["## Gates", "", *[f"- {v.line()}" for v in verdicts], ""]
    return lines
