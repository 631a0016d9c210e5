"""ONNX graphs of one torch.nn.MultiheadAttention self-attention layer for ONNX Runtime (CPU).

ORT's graph optimiser does not fuse a plain torch.onnx export of nn.MultiheadAttention, so the
graphs are built by hand around ORT's own attention kernels (contrib ops, domain com.microsoft):

  mha        MatMul(x, W_in^T) -> Split into Q, K, V -> com.microsoft.MultiHeadAttention(Q, K, V,
             bias=b_in) -> MatMul(., W_out^T) + b_out. Non-causal MHA on CPU runs MLAS's fused
             flash-attention kernel (no L x L score matrix); with unidirectional=1 (causal) it
             takes ORT's unfused path (scores, masked softmax, P.V).
  attention  com.microsoft.Attention(x, W_in^T, b_in) (packed QKV projection and the attention in
             one op, unfused scores) -> MatMul(., W_out^T) + b_out. unidirectional=1 = causal.
  onnx23     MatMul + Add (x W_in^T + b_in) -> Split -> the standard ONNX Attention op (opset 23,
             q_num_heads = kv_num_heads = H, is_causal) -> MatMul + Add. python3-onnx 1.12 does
             not know opset 23, so this graph is not checked by onnx.checker.

int8 graphs, as onnxruntime.quantization's dynamic quantization writes them (weights int8,
symmetric per output column, zero points 0; activations quantized per call to uint8 by ORT):
  mha_int8   com.microsoft.DynamicQuantizeMatMul(x, W_in^T) -> Split -> MultiHeadAttention (float,
             bias b_in) -> DynamicQuantizeMatMul(., W_out^T, bias b_out).
  qattention DynamicQuantizeLinear(x) -> com.microsoft.QAttention (int8 packed QKV projection,
             float attention) -> DynamicQuantizeMatMul(., W_out^T, bias b_out).

Weights are the torch layer's state_dict as NumPy arrays: in_proj_weight (3E, E),
in_proj_bias (3E), out_proj.weight (E, E), out_proj.bias (E). Input "x" (N, L, E) float32,
output "y" (N, L, E); N and L are symbolic so one graph serves every batch and length.
"""
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VARIANTS = ("mha", "attention", "onnx23", "mha_int8", "qattention")
INT8_VARIANTS = ("mha_int8", "qattention")
_OPSET = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]


def _init(name, array):
    return numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name)


def _quantized(name, w_t):
    """w_t (K, N) float -> initializers name (int8, per-column symmetric), name_scale (N),
    name_zp (N int8 zeros)."""
    w_t = np.asarray(w_t, np.float32)
    scale = np.abs(w_t).max(axis=0) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(w_t / scale), -127, 127).astype(np.int8)
    return [numpy_helper.from_array(q, name), _init(name + "_scale", scale),
            numpy_helper.from_array(np.zeros(w_t.shape[1], np.int8), name + "_zp")]


def build(variant, state, num_heads, causal=False):
    """Returns an onnx.ModelProto of the layer (self-attention) in the given variant."""
    w_in = np.asarray(state["in_proj_weight"], np.float32)
    b_in = np.asarray(state["in_proj_bias"], np.float32)
    w_out = np.asarray(state["out_proj.weight"], np.float32)
    b_out = np.asarray(state["out_proj.bias"], np.float32)
    e = w_out.shape[0]
    inits = [_init("w_out_t", w_out.T), _init("b_out", b_out)]
    unidirectional = 1 if causal else 0
    if variant == "mha":
        inits += [_init("w_in_t", w_in.T), _init("b_in", b_in),
                  numpy_helper.from_array(np.array([e, e, e], np.int64), "split_sizes")]
        nodes = [
            helper.make_node("MatMul", ["x", "w_in_t"], ["qkv"]),
            helper.make_node("Split", ["qkv", "split_sizes"], ["q", "k", "v"], axis=2),
            helper.make_node("MultiHeadAttention", ["q", "k", "v", "b_in"], ["ctx"],
                             domain="com.microsoft", num_heads=num_heads,
                             unidirectional=unidirectional),
        ]
    elif variant == "attention":
        inits += [_init("w_in_t", w_in.T), _init("b_in", b_in)]
        nodes = [
            helper.make_node("Attention", ["x", "w_in_t", "b_in"], ["ctx"],
                             domain="com.microsoft", num_heads=num_heads,
                             unidirectional=unidirectional),
        ]
    elif variant == "onnx23":
        inits += [_init("w_in_t", w_in.T), _init("b_in", b_in),
                  numpy_helper.from_array(np.array([e, e, e], np.int64), "split_sizes")]
        nodes = [
            helper.make_node("MatMul", ["x", "w_in_t"], ["qkv_nb"]),
            helper.make_node("Add", ["qkv_nb", "b_in"], ["qkv"]),
            helper.make_node("Split", ["qkv", "split_sizes"], ["q", "k", "v"], axis=2),
            helper.make_node("Attention", ["q", "k", "v"], ["ctx"], q_num_heads=num_heads,
                             kv_num_heads=num_heads, is_causal=1 if causal else 0),
        ]
    elif variant == "mha_int8":
        inits = [_init("b_in", b_in), _init("b_out", b_out),
                 numpy_helper.from_array(np.array([e, e, e], np.int64), "split_sizes")]
        inits += _quantized("w_in_q", w_in.T) + _quantized("w_out_q", w_out.T)
        nodes = [
            helper.make_node("DynamicQuantizeMatMul",
                             ["x", "w_in_q", "w_in_q_scale", "w_in_q_zp"], ["qkv"],
                             domain="com.microsoft"),
            helper.make_node("Split", ["qkv", "split_sizes"], ["q", "k", "v"], axis=2),
            helper.make_node("MultiHeadAttention", ["q", "k", "v", "b_in"], ["ctx"],
                             domain="com.microsoft", num_heads=num_heads,
                             unidirectional=unidirectional),
        ]
    elif variant == "qattention":
        inits = [_init("b_in", b_in), _init("b_out", b_out)]
        inits += _quantized("w_in_q", w_in.T) + _quantized("w_out_q", w_out.T)
        nodes = [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["x_q", "x_scale", "x_zp"]),
            helper.make_node("QAttention",
                             ["x_q", "w_in_q", "b_in", "x_scale", "w_in_q_scale", "", "x_zp",
                              "w_in_q_zp"], ["ctx"],
                             domain="com.microsoft", num_heads=num_heads,
                             unidirectional=unidirectional),
        ]
    else:
        raise ValueError(f"unknown ORT graph variant '{variant}' (one of {VARIANTS})")
    if variant in INT8_VARIANTS:
        nodes.append(helper.make_node("DynamicQuantizeMatMul",
                                      ["ctx", "w_out_q", "w_out_q_scale", "w_out_q_zp", "b_out"],
                                      ["y"], domain="com.microsoft"))
    else:
        nodes += [
            helper.make_node("MatMul", ["ctx", "w_out_t"], ["proj"]),
            helper.make_node("Add", ["proj", "b_out"], ["y"]),
        ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "L", e])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "L", e])
    graph = helper.make_graph(nodes, f"mha_{variant}{'_causal' if causal else ''}", [x], [y],
                              initializer=inits)
    opset = list(_OPSET)
    if variant == "onnx23":
        opset[0] = helper.make_opsetid("", 23)
    model = helper.make_model(graph, opset_imports=opset, producer_name="bench/peers")
    model.ir_version = 10 if variant == "onnx23" else 8  # ONNX 1.12 writes 8; ORT reads both.
    if variant != "onnx23":
        onnx.checker.check_model(model)
    return model
