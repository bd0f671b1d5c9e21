"""Which float precision each device runs our models fastest in: `auto`'s choices for
`targets.fp16` and `serve.dtype` (measured in bench/GPU.md)."""
from __future__ import annotations

import torch

TF32_MAJOR = 8  # compute capability from which fp32 runs on tensor cores (Ampere)


def gpu_fp16_pays(device: str | torch.device = "cuda") -> bool:
    """fp16 pays on GPUs whose fp32 has no tensor cores (compute capability < 8: V100,
    T4). From Ampere on, cuDNN runs fp32 LSTMs in TF32: on an H100 the teacher scored
    0.76-0.93x as fast in fp16 as in fp32 and agreed less with the CPU's scores."""
    major, _ = torch.cuda.get_device_capability(torch.device(device))
    return major < TF32_MAJOR


def cpu_has_native_bf16() -> bool:
    """AMX or AVX512-BF16: bf16 matmuls run at several times the fp32 rate."""
    cpu = torch.cpu
    checks = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(getattr(cpu, name, lambda: False)() for name in checks)
