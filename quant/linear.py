"""``QuantLinear``: every supported format converted at load time into one runtime layout.

Runtime layout (what ``edge_llm.kernels.w4a16_matmul`` consumes)::

    qweight int32 (K/8, N)   GPTQ-style: row k at bits 4*(k % 8) of qweight[k // 8, n], q in 0..15
    scales  (G, N)           activation dtype
    zeros   (G, N)           activation dtype, float value of the integer zero point
    W[k, n] = (q[k, n] - zeros[k // gs, n]) * scales[k // gs, n]      y = x @ W + bias

Act-order checkpoints: rows are sorted by ``g_idx`` at load so every group is contiguous and
``perm`` (int64, (K,), as index_select takes it) holds the original row of each sorted row;
forward gathers ``x[..., perm]`` first, unless ``input_permuted`` says the caller delivers x
in sorted order already (model/fuse.py arranges that: an RMSNorm writing its output in that
order, or the previous linear's output columns permuted). A ``g_idx`` whose sorted form is still not
``k // gs`` (groups of unequal sizes) keeps rows unsorted and a general ``g_idx`` buffer; only
the torch reference serves that case.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .awq import awq_shapes, unpack_awq
from .compressed import compressed_shapes, unpack_compressed
from .cpu_dense import DENSE_MIN_ROWS, dense_bf16_copy
from .cpu_int4 import CpuInt4Weight, cpu_int4_matmul, pack_for_cpu
from .formats import QuantSpec
from .gptq import gptq_shapes, unpack_gptq
from .packing import (
    PACK,
    PLANE_TILE,
    QuantizedWeight,
    pack_int4,
    pack_planes,
    plane_rows,
    sequential_g_idx,
    unpack_int4,
)

_UNSET = object()
_kernel_fn: object = _UNSET
_gather_fn: object = None  # edge_llm.kernels.gather_columns, set with _kernel_fn
_silu_fn: object = None  # edge_llm.kernels.w4a16_silu_mul, set with _kernel_fn


def _w4a16_kernel():
    """``edge_llm.kernels.w4a16_matmul`` when the kernels package provides it, else None."""
    global _kernel_fn, _gather_fn, _silu_fn
    if _kernel_fn is _UNSET:
        try:
            from edge_llm.kernels import gather_columns, w4a16_matmul, w4a16_silu_mul
        except ImportError:
            w4a16_matmul = gather_columns = w4a16_silu_mul = None
        _kernel_fn, _gather_fn, _silu_fn = w4a16_matmul, gather_columns, w4a16_silu_mul
    return _kernel_fn


def _cuda_kernels(x: torch.Tensor) -> tuple[Callable, Callable] | None:
    """(``edge_llm.kernels.w4a16_matmul``, ``w4a16_silu_mul``) for x on CUDA when the kernels
    package provides them, else None (the torch reference serves x)."""
    if x.device.type != "cuda" or _w4a16_kernel() is None:
        return None
    return _kernel_fn, _silu_fn


def _gather_columns(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """x[..., perm]: the kernels package's gather (one Triton launch on CUDA) when present."""
    _w4a16_kernel()
    if _gather_fn is None:
        return x.index_select(-1, perm)
    return _gather_fn(x, perm)


def quant_tensor_suffixes(spec: QuantSpec, bias: bool = False) -> tuple[tuple[str, ...], ...]:
    """(required, optional) checkpoint tensor suffixes of one quantized linear in ``spec``."""
    extra = ("bias",) if bias else ()
    if spec.method == "awq":
        if spec.zero_point:
            return ("qweight", "qzeros", "scales", *extra), ()
        return ("qweight", "scales", *extra), ("qzeros",)
    if spec.method == "gptq":
        if spec.sym:
            return ("qweight", "scales", *extra), ("qzeros", "g_idx")
        return ("qweight", "qzeros", "scales", *extra), ("g_idx",)
    if spec.sym:
        return ("weight_packed", "weight_scale", *extra), (
            "weight_shape", "weight_g_idx", "weight_zero_point")
    return ("weight_packed", "weight_scale", "weight_zero_point", *extra), (
        "weight_shape", "weight_g_idx")


def dequantize_runtime(
    qweight: torch.Tensor,  # int32 (K/8, N)
    scales: torch.Tensor,  # (G, N)
    zeros: torch.Tensor,  # (G, N)
    group_size: int,
    g_idx: torch.Tensor | None = None,  # (K,) general groups; None means k // group_size
    dtype: torch.dtype = torch.float32,
    planes_packed: bool = False,  # words in the plane-packed order (QuantLinear.pack_planes)
) -> torch.Tensor:
    """Torch reference of the runtime layout: W as (K, N) in ``dtype`` (rows in stored order)."""
    q = unpack_int4(qweight, dim=0)  # (K, N)
    k = q.shape[0]
    if planes_packed:  # row i of the words holds stored row plane_rows[i]
        natural = torch.empty_like(q)
        natural[plane_rows(k, q.device)] = q
        q = natural
    idx = sequential_g_idx(k, group_size).to(q.device) if g_idx is None else g_idx
    idx = idx.long()
    return (q.to(dtype) - zeros.to(dtype)[idx]) * scales.to(dtype)[idx]


class QuantLinear(nn.Module):
    """A 4-bit weight-only linear: ``y = x @ W + bias`` with W from the runtime layout.

    Built empty (the loader builds on the meta device); ``load_checkpoint_tensors`` fills it.
    On CPU, bf16 inputs go through torch's int4 CPU kernel on words repacked once, at the first
    call (quant/cpu_int4.py); other inputs, and shapes that kernel refuses, take the torch
    reference: the dequantized fp32 weight, cached at the first call (4 bytes a weight) so no
    step dequantizes. Every change of the tensors drops both caches (``drop_cpu_cache``).
    On CUDA it calls ``edge_llm.kernels.w4a16_matmul`` when that exists (fp32 accumulation there).
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool, spec: QuantSpec, dtype: torch.dtype
    ) -> None:
        super().__init__()
        if in_features % PACK or out_features % PACK:
            raise ValueError(
                f"QuantLinear needs in_features and out_features divisible by {PACK}, got "
                f"({in_features}, {out_features})."
            )
        self.in_features, self.out_features = in_features, out_features
        self.spec, self.dtype = spec, dtype
        self.group_size = spec.group_size_for(in_features)
        if spec.method == "awq" and in_features % self.group_size:
            raise ValueError(
                f"AWQ needs in_features ({in_features}) divisible by group_size "
                f"({self.group_size})."
            )
        groups = -(-in_features // self.group_size)
        self.register_buffer("qweight", torch.empty(in_features // PACK, out_features,
                                                    dtype=torch.int32))
        self.register_buffer("scales", torch.empty(groups, out_features, dtype=dtype))
        self.register_buffer("zeros", torch.empty(groups, out_features, dtype=dtype))
        self.register_buffer("bias", torch.empty(out_features, dtype=dtype) if bias else None)
        self.register_buffer("perm", None)
        self.register_buffer("g_idx", None)
        self.input_permuted = False  # x arrives as x[..., perm] (see the module docstring)
        self.planes_packed = False  # qweight in the plane-packed word order (pack_planes)
        self._cpu_weight: torch.Tensor | None = None  # (K, N) fp32, in the input's row order
        self._cpu_int4: CpuInt4Weight | None = None  # the words for the int4 CPU kernel
        self._cpu_int4_built = False  # _cpu_int4 decided (None then means: not applicable)
        # (N, K) bf16 in the input's row order, for steps of many rows (quant/cpu_dense.py)
        self._cpu_dense: torch.Tensor | None = None
        self._cpu_dense_built = False  # _cpu_dense decided (None: over the memory budget)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, {self.spec.method} gs={self.group_size}")

    def checkpoint_tensor_names(self) -> list[str]:
        """Every suffix the loader should pass when present (required and optional).

        Required: see :meth:`required_checkpoint_tensor_names`. Optional: GPTQ ``g_idx`` (absent
        means sequential groups) and ``qzeros`` when symmetric, AWQ ``qzeros`` when
        ``zero_point=False``, compressed-tensors ``weight_shape``, ``weight_g_idx`` and (sym)
        ``weight_zero_point``.
        """
        required, optional = quant_tensor_suffixes(self.spec, self.bias is not None)
        return [*required, *optional]

    def required_checkpoint_tensor_names(self) -> list[str]:
        return list(quant_tensor_suffixes(self.spec, self.bias is not None)[0])

    def load_checkpoint_tensors(self, tensors: dict[str, torch.Tensor], device) -> None:
        """Validate one module's checkpoint tensors, convert them to the runtime layout, and move
        each result once to ``device`` (scales/zeros/bias in ``self.dtype``).

        Raises ValueError naming the tensor on a missing, unexpected, mis-shaped or mis-typed one.
        """
        self._check_names(tensors)
        self._check_tensors(tensors)
        if torch.device(device).type == "cuda":
            # convert on the GPU: the raw format tensors cross once, and the unpack/repack of
            # a 7B model takes well under a second there instead of ~100 s on two CPU cores
            tensors = {name: t.to(device, non_blocking=True) for name, t in tensors.items()}
        w = self._unpack(tensors)
        try:
            w.validate()
        except ValueError as exc:
            raise ValueError(f"{self.spec.method} tensors of {self.extra_repr()}: {exc}") from exc
        qweight, perm, g_idx = _runtime_rows(w)
        # copy=True: never keep a view of the caller's tensors (the loader's staged reads hand
        # out views of a whole file's buffer, which a kept view would hold in memory)
        self.qweight = qweight.to(device)
        self.scales = w.scales.to(device=device, dtype=self.dtype, copy=True)
        self.zeros = w.zeros.to(device=device, dtype=self.dtype, copy=True)
        self.perm = None if perm is None else perm.to(device)
        self.g_idx = None if g_idx is None else g_idx.to(device, copy=True)
        if "bias" in tensors:
            self.bias = tensors["bias"].to(device=device, dtype=self.dtype, copy=True)
        self.drop_cpu_cache()

    def _check_names(self, tensors: dict[str, torch.Tensor]) -> None:
        required, optional = quant_tensor_suffixes(self.spec, self.bias is not None)
        missing = [n for n in required if n not in tensors]
        unexpected = [n for n in tensors if n not in required and n not in optional]
        if missing or unexpected:
            raise ValueError(
                f"{self.spec.method} linear ({self.in_features} -> {self.out_features}): "
                f"missing tensors {missing}, unexpected tensors {unexpected}; expected "
                f"{list(required)} and optionally {list(optional)}."
            )

    def _expected_shapes(self, tensors: dict[str, torch.Tensor]) -> dict[str, tuple]:
        k, n, gs = self.in_features, self.out_features, self.group_size
        if self.spec.method == "awq":
            shapes = awq_shapes(k, n, gs)
        elif self.spec.method == "gptq":
            shapes = gptq_shapes(k, n, gs)
        else:
            zp = tensors.get("weight_zero_point")
            shapes = compressed_shapes(k, n, gs, zp.dtype if zp is not None else torch.int32)
        shapes["bias"] = (n,)
        return shapes

    def _check_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        shapes = self._expected_shapes(tensors)
        where = f"(in_features={self.in_features}, out_features={self.out_features}, " \
                f"group_size={self.group_size}, {self.spec.method})"
        for name, t in tensors.items():
            if tuple(t.shape) != shapes[name]:
                raise ValueError(f"Tensor {name!r}: expected shape {shapes[name]}, found "
                                 f"{tuple(t.shape)} {where}.")
            if name in ("qweight", "qzeros", "weight_packed") and t.dtype != torch.int32:
                raise ValueError(f"Tensor {name!r}: expected dtype torch.int32, found {t.dtype}.")
            if name == "weight_zero_point" and t.dtype not in (torch.int32, torch.int8):
                raise ValueError(f"Tensor {name!r}: expected int32 (packed) or int8, found "
                                 f"{t.dtype}.")
            if name in ("g_idx", "weight_g_idx", "weight_shape") and (
                t.is_floating_point() or t.is_complex() or t.dtype == torch.bool
            ):
                raise ValueError(f"Tensor {name!r}: expected an integer dtype, found {t.dtype}.")
            if name in ("scales", "weight_scale", "bias") and not t.is_floating_point():
                raise ValueError(f"Tensor {name!r}: expected a float dtype, found {t.dtype}.")
        shape = tensors.get("weight_shape")
        if shape is not None and shape.tolist() != [self.out_features, self.in_features]:
            raise ValueError(f"Tensor 'weight_shape' says {shape.tolist()}, the model expects "
                             f"[{self.out_features}, {self.in_features}].")

    def _unpack(self, tensors: dict[str, torch.Tensor]) -> QuantizedWeight:
        k, n, gs, spec = self.in_features, self.out_features, self.group_size, self.spec
        fmt_tensors = {name: t for name, t in tensors.items() if name != "bias"}
        if spec.method == "awq":
            return unpack_awq(fmt_tensors, k, n, gs)
        if spec.method == "gptq":
            return unpack_gptq(fmt_tensors, k, n, gs, spec.checkpoint_format, spec.sym)
        return unpack_compressed(fmt_tensors, k, n, gs, spec.sym)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W in ``nn.Linear`` layout (out_features, in_features), original row order."""
        w = dequantize_runtime(self.qweight, self.scales, self.zeros, self.group_size,
                               self.g_idx, dtype, self.planes_packed)  # (K, N) stored order
        if self.perm is not None:
            restored = torch.empty_like(w)
            restored[self.perm.long()] = w  # sorted row j is original row perm[j]
            w = restored
        return w.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = _cuda_kernels(x) if self.g_idx is None else None
        if kernels is not None:  # w4a16_matmul launches the table's kernel for the shape
            # zero points are integers here: every format's are validated as 0..15 at load
            y = kernels[0](self._kernel_input(x), self.qweight, self.scales, self.zeros,
                           self.group_size, integer_zeros=True,
                           planes_packed=self.planes_packed)  # (M, N)
            return self._kernel_output(y, x, self.out_features)
        if x.device.type == "cpu":
            if x.dtype == torch.bfloat16:
                packed = self._cpu_int4_weight()
                if packed is not None:
                    return self._forward_cpu_int4(packed, x)
            if self._cpu_weight is None:
                self._cpu_weight = self._weight_for_input().contiguous()
            w = self._cpu_weight
        else:
            w = self._weight_for_input()
        y = x.to(torch.float32) @ w  # (..., N) fp32 accumulation
        if self.bias is not None:
            y = y + self.bias.to(torch.float32)
        return y.to(x.dtype)

    def drop_cpu_cache(self) -> None:
        """Forget the CPU forms of the weight (dense fp32 and int4-packed): the next CPU call
        builds them again from the current tensors. Called on every change of the tensors."""
        self._cpu_weight = None
        self._cpu_int4, self._cpu_int4_built = None, False
        self._cpu_dense, self._cpu_dense_built = None, False

    def cpu_int4_weight(self) -> CpuInt4Weight | None:
        """The weight in the int4 CPU kernel's form for a caller that runs the kernel itself
        on bf16 rows as they arrive (model/cpu_decode.py): None where ``forward`` would not
        run it alone (a bias, an input gather, a layout or shape the kernel refuses)."""
        if self.bias is not None or (self.perm is not None and not self.input_permuted):
            return None
        return self._cpu_int4_weight()

    def _cpu_int4_weight(self) -> CpuInt4Weight | None:
        """The words packed for the int4 CPU kernel, built at the first call; None where that
        kernel does not apply (a general g_idx, plane-packed words, a shape it refuses)."""
        if not self._cpu_int4_built:
            usable = self.g_idx is None and not self.planes_packed
            self._cpu_int4 = (pack_for_cpu(self.qweight, self.scales, self.zeros,
                                           self.group_size) if usable else None)
            self._cpu_int4_built = True
        return self._cpu_int4

    def _cpu_dense_weight(self) -> torch.Tensor | None:
        """The dense bf16 copy for many-row CPU steps, made at the first call; None where the
        memory rule of quant/cpu_dense.py leaves no room for it."""
        if not self._cpu_dense_built:
            self._cpu_dense = dense_bf16_copy(self._weight_for_input())
            self._cpu_dense_built = True
        return self._cpu_dense

    def _forward_cpu_int4(self, packed: CpuInt4Weight, x: torch.Tensor) -> torch.Tensor:
        """y = x @ W + bias on the int4 CPU kernel, or for ``DENSE_MIN_ROWS`` rows and more on
        the dense bf16 copy where the memory rule allows one (quant/cpu_dense.py); x bf16
        (..., K) -> (..., N) bf16."""
        x2 = x.reshape(-1, self.in_features)  # (M, K)
        dense = self._cpu_dense_weight() if x2.shape[0] >= DENSE_MIN_ROWS else None
        if dense is not None:  # in the order x arrives: no gather
            y = torch.nn.functional.linear(x2, dense)  # (M, N)
        else:
            if self.perm is not None and not self.input_permuted:
                x2 = x2.index_select(-1, self.perm)  # sorted row order, as the words are stored
            y = cpu_int4_matmul(x2, packed)  # (M, N)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def forward_silu_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up for a merged [gate | up] linear (``out_features`` = 2 I), (..., I),
        through the kernels package's ``w4a16_silu_mul`` (on CUDA it may compute the product
        in the W4A16 GEMV's epilogue); None where that path does not apply (not CUDA, a
        general g_idx, a bias, no kernels package): the caller then takes ``forward``."""
        kernels = _cuda_kernels(x) if self.g_idx is None and self.bias is None else None
        if kernels is None:
            return None
        y = kernels[1](self._kernel_input(x), self.qweight, self.scales, self.zeros,
                       self.group_size, integer_zeros=True, planes_packed=self.planes_packed)
        return self._kernel_output(y, x, self.out_features // 2)

    def _weight_for_input(self) -> torch.Tensor:
        """W (K, N) fp32 with rows in the order x arrives: stored (sorted) order when
        ``input_permuted``, else the original order."""
        if self.input_permuted:
            return dequantize_runtime(self.qweight, self.scales, self.zeros, self.group_size,
                                      self.g_idx, torch.float32, self.planes_packed)
        return self.dequantize(torch.float32).t()

    def planes_packable(self) -> bool:
        """Whether ``pack_planes`` applies: K and the group size multiples of 128, groups
        ``k // group_size`` (no general g_idx)."""
        return (self.g_idx is None and self.in_features % PLANE_TILE == 0
                and self.group_size % PLANE_TILE == 0)

    def pack_planes(self) -> None:
        """Repack the words into the plane-packed order (``quant.packing.plane_rows``;
        ``edge_llm.kernels.w4a16_matmul(planes_packed=True)``): the W4A16 plane dots then
        read x as it arrives instead of a copy of x in plane order. The function is
        unchanged; ``dequantize`` and the CPU reference read the new order. Raises
        ValueError when ``planes_packable`` is False."""
        if self.planes_packed:
            return
        if not self.planes_packable():
            raise ValueError(f"pack_planes: needs in_features ({self.in_features}) and "
                             f"group_size ({self.group_size}) multiples of {PLANE_TILE} and "
                             "no general g_idx")
        self.qweight = pack_planes(self.qweight)
        self.planes_packed = True
        self.drop_cpu_cache()

    def take_permuted_input(self) -> None:
        """From now on x arrives as ``x[..., perm]`` (the caller gathers or writes it so):
        forward skips its own gather. Only for act-order linears (``perm`` set)."""
        if self.perm is None:
            raise ValueError("take_permuted_input: this linear has no act-order permutation")
        self.input_permuted = True
        self.drop_cpu_cache()

    def permute_outputs(self, cols: torch.Tensor) -> None:
        """Reorder the output columns: afterwards ``self(x) == old(x)[..., cols]`` (``cols``
        int64, a permutation of range(out_features)). New tensors; used by model/fuse.py."""
        if cols.shape != (self.out_features,):
            raise ValueError(f"permute_outputs: expected {self.out_features} columns, got "
                             f"{tuple(cols.shape)}")
        cols = cols.to(self.qweight.device)
        self.qweight = self.qweight.index_select(1, cols)
        self.scales = self.scales.index_select(1, cols)
        self.zeros = self.zeros.index_select(1, cols)
        if self.bias is not None:
            self.bias = self.bias.index_select(0, cols)
        self.drop_cpu_cache()

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., K) as the kernels take it: (M, K), in the words' row order."""
        if self.perm is not None and not self.input_permuted:
            x = _gather_columns(x, self.perm.long())
        return x.reshape(-1, self.in_features)  # (M, K)

    def _kernel_output(self, y: torch.Tensor, x: torch.Tensor, width: int) -> torch.Tensor:
        """The kernel's (M, width) result plus the bias, in x's leading shape."""
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], width)


def _runtime_rows(
    w: QuantizedWeight,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(qweight (K/8, N), perm or None, general g_idx or None) for the runtime layout."""
    k, gs = w.in_features, w.group_size
    if w.is_sequential():
        return pack_int4(w.q, dim=0), None, None
    perm = torch.argsort(w.g_idx.long(), stable=True)  # sorted row j <- original row perm[j]
    if torch.equal(w.g_idx[perm], sequential_g_idx(k, gs, w.g_idx.device)):
        return pack_int4(w.q[perm], dim=0), perm, None
    return pack_int4(w.q, dim=0), None, w.g_idx.to(torch.int32)


def make_linear(
    in_features: int, out_features: int, bias: bool, spec: QuantSpec | None, dtype: torch.dtype
) -> nn.Module:
    """``nn.Linear`` when ``spec`` is None, else an empty ``QuantLinear`` for ``spec``."""
    if spec is None:
        return nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    return QuantLinear(in_features, out_features, bias, spec, dtype)
