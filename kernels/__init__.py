"""Compute kernels: Triton on CUDA, plain-torch references everywhere else.

Callers use the dispatch functions of dispatch.py (re-exported here); each picks the Triton
kernel when the tensors live on a CUDA device in fp16/bf16, and the reference otherwise (CPU,
fp32). Kernels: W4A16 matmul
(w4a16.py), paged attention and the K/V write (paged_attention.py), fused RMSNorm / residual
add / SiLU-and-mul (fused.py), rotary (rotary.py), rotary with the K/V cache write
(rotary_kv.py), the column gather of act-order inputs (gather.py). A uint8 KV cache holds
fp8 e4m3 codes: the writes encode and the attention kernels decode them (kv_fp8.py). Every
kernel starts with ``pdl_enter`` and launches through ``pdl_kwargs`` (pdl.py: programmatic
dependent launch on Hopper and later, for short forwards by default).
"""

if __name__ == "kernels":  # imported by its bare name through a checkout root on sys.path
    from edge_llm.checkout_path import defer_to_installed

    defer_to_installed(__name__, __file__)
else:
    from .dispatch import *  # noqa: F403 - the dispatchers and the references
    from .dispatch import __all__  # noqa: F401
