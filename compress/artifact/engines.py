"""Which engines load which artifacts: the rules their loaders and kernels apply, kept as data.

A claim that an artifact "loads in vLLM" must not rest on hope. The checks that vLLM's
loaders, its kernel selection and its kernels apply are written down, each with where it
comes from: what every format shares in engine_rules.py, each format's loader in its
codec (artifact/formats/). Every artifact's config is checked against them when it is
written (compress warns, naming the engine and the reason; the manifest keeps the
verdicts), and scripts/vllm_check.py runs vLLM's CPU build on every artifact kind:
tests/test_engines.py holds these rules to its committed results
(benchmarks/results/vllm_check_<ISA>.json), so a rule that contradicts a real run fails the suite.
transformers is run for real in tests/test_interop.py; its rules are the known failures
of its loader, so that compress can warn first.
"""

from __future__ import annotations

from collections.abc import Iterable

from compress.artifact.engine_rules import (
    CPU,
    DTYPE,
    GPU,
    HOST,
    LATER_VLLM_MODEL,
    NO_NATIVE_VLLM_MODEL,
    VLLM_HEAD_IS_EMBEDDING,
    VLLM_VERSION,
    WNA16,
    Problem,
    Verdict,
    auto_dtype,
)
from compress.artifact.formats import reading_codec

__all__ = [
    "CPU",
    "GPU",
    "VLLM_VERSION",
    "engine_problems",
    "transformers_problems",
    "transformers_route",
    "vllm_note",
    "vllm_problems",
    "vllm_verdict",
]


def vllm_verdict(
    config: dict,
    tensor_names: Iterable[str] = (),
    device: str = GPU,
    *,
    dtype: str | None = None,
    host_isa: Iterable[str] | None = None,
) -> Verdict:
    """What vLLM 0.32 does with an artifact with this config.json and these tensor names on
    `device` ("gpu" or "cpu"), computing in `dtype` (None: vLLM's auto choice). For the CPU,
    `host_isa` lists the host's instruction sets ("avx512f", "avx2", ...); None assumes
    one the WNA16 op is built for."""
    codec = reading_codec(config)
    if codec is None:
        return Verdict(())
    act_dtype = auto_dtype(config, dtype)
    out, wna16 = codec.vllm_problems(config, list(tensor_names), device, act_dtype)
    if any(p.stage == "load" for p in out):  # the first forward is never reached
        return Verdict(tuple(dict.fromkeys(out)))
    rules = WNA16[device]
    if wna16 and act_dtype not in rules["forward_dtypes"]:
        out.append(
            Problem(
                f"its 4-bit kernel computes in bfloat16 or float16, not {act_dtype} (leave dtype "
                "at auto)",
                DTYPE,
                "forward",
            )
        )
    hosts = rules["hosts"]
    if wna16 and hosts and host_isa is not None and not set(hosts) & set(host_isa):
        out.append(
            Problem(
                "this CPU lacks AVX-512 (or RISC-V V, s390x, POWER), the only builds with the "
                "4-bit kernel cpu_gemm_wna16",
                HOST,
                "forward",
            )
        )
    return Verdict(tuple(dict.fromkeys(out)))


def vllm_problems(config: dict, tensor_names: Iterable[str] = (), device: str = GPU) -> list[str]:
    """Why vLLM on `device` would refuse (or crash on) an artifact with this config.json
    and these tensor names, computing in its auto dtype on a host its kernels are built
    for; [] when every rule holds."""
    return vllm_verdict(config, tensor_names, device).texts()


def vllm_note(arch: str) -> str | None:
    """Where vLLM runs an architecture otherwise than the verdict's rules model: one it has
    no model of its own for (its Transformers backend), or one whose model ignores the
    artifact's lm_head."""
    if arch in VLLM_HEAD_IS_EMBEDDING:
        return (
            f"vLLM's {arch} computes the logits with the embedding and skips lm_head: an "
            "artifact's own head (--lm-head w8, the default) is run by llmpress and "
            "transformers, while vLLM multiplies by the 16-bit embedding"
        )
    if arch not in NO_NATIVE_VLLM_MODEL:
        return None
    if arch in LATER_VLLM_MODEL:
        return (
            f"vLLM {LATER_VLLM_MODEL[arch]} runs {arch} with a model of its own; vLLM "
            f"{VLLM_VERSION}, whose loading llmpress's vLLM checks model, has none: they do "
            "not cover it"
        )
    return (
        f"vLLM has no model of its own for {arch}: it would run through vLLM's Transformers "
        "backend, which llmpress's vLLM checks do not cover"
    )


def transformers_problems(config: dict) -> list[str]:
    """Why plain `AutoModelForCausalLM.from_pretrained` fails on this config.json."""
    codec = reading_codec(config)
    return [] if codec is None else codec.transformers_problems(config)


def transformers_route(config: dict) -> dict | None:
    """The keyword arguments of the format's transformers config that `from_pretrained`
    needs for this config.json: {} for the plain call (`dequantize=True` for
    compressed-tensors zero points), None when transformers cannot load it."""
    codec = reading_codec(config)
    return {} if codec is None else codec.transformers_route(config)


def engine_problems(config: dict, tensor_names: Iterable[str] = ()) -> dict[str, list[str]]:
    """{"vllm": [...], "vllm-cpu": [...], "transformers": [...]}: what each engine will
    refuse ("vllm": on a CUDA GPU; "vllm-cpu": its CPU build, on a CPU it is built for)."""
    names = list(tensor_names)
    return {
        "vllm": vllm_problems(config, names, GPU),
        "vllm-cpu": vllm_problems(config, names, CPU),
        "transformers": transformers_problems(config),
    }
