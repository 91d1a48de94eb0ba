"""4-bit weight quantization: format detection, pack/unpack, ``QuantLinear``, quantizers.

Import as ``edge_llm.quant``. Formats (AWQ GEMM, GPTQ v1/v2, compressed-tensors pack-quantized)
are read into one runtime layout (see ``linear.py``); ``quantize_model`` writes AWQ or GPTQ
checkpoints from a transformers Llama-family model with RTN, GPTQ or (optionally) AutoAWQ.
"""

if __name__ == "quant":  # imported by its bare name through a checkout root on sys.path
    from edge_llm.checkout_path import defer_to_installed

    defer_to_installed(__name__, __file__)
else:
    from .awq import AWQ_ORDER, pack_awq, unpack_awq
    from .calibration import (
        evaluation_token_ids,
        load_calibration_texts,
        load_eval_text,
        load_heldout_text,
    )
    from .compressed import pack_compressed, unpack_compressed
    from .export import quantization_config_for, save_quantized
    from .formats import (
        SUPPORTED_QUANT_FORMATS,
        QuantSpec,
        UnsupportedQuantizationError,
        detect_quant_spec,
        is_quantized_module_name,
        parse_quantization_config,
    )
    from .gptq import pack_gptq, unpack_gptq
    from .gptq_method import gptq_quantize
    from .linear import (
        QuantLinear,
        dequantize_runtime,
        make_linear,
        quant_tensor_suffixes,
    )
    from .linear_concat import concat_mismatch
    from .packing import QuantizedWeight, pack_int4, unpack_int4
    from .perplexity import perplexity
    from .quantize import quantize_model
    from .rtn import rtn_quantize

    __all__ = [
        "AWQ_ORDER",
        "SUPPORTED_QUANT_FORMATS",
        "QuantLinear",
        "QuantSpec",
        "QuantizedWeight",
        "UnsupportedQuantizationError",
        "concat_mismatch",
        "dequantize_runtime",
        "detect_quant_spec",
        "evaluation_token_ids",
        "gptq_quantize",
        "is_quantized_module_name",
        "load_calibration_texts",
        "load_eval_text",
        "load_heldout_text",
        "make_linear",
        "pack_awq",
        "pack_compressed",
        "pack_gptq",
        "pack_int4",
        "parse_quantization_config",
        "perplexity",
        "quant_tensor_suffixes",
        "quantization_config_for",
        "quantize_model",
        "rtn_quantize",
        "save_quantized",
        "unpack_awq",
        "unpack_compressed",
        "unpack_gptq",
        "unpack_int4",
    ]
