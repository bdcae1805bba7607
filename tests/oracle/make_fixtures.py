#!/usr/bin/env python3
"""make_fixtures.py: the outside oracle for the CPU reference model.

Writes small DeepSeek-V3-architecture checkpoints in the published FP8 layout, and for each
one the logits that Hugging Face transformers computes in float64 from the dequantized
weights. Run on a machine with torch, transformers (5.x) and safetensors:

    python3 tests/oracle/make_fixtures.py --out DIR [--only NAME ...]

Each fixture DIR/<name>/ holds config.json, model.safetensors.index.json, the shards
model-0000i-of-0000n.safetensors, fixture.json {"prompt", "greedy", "tolerance", "notes",
...} and ref_logits.npy (float64 [T, vocab]).

How a fixture is made (see README.md beside this file for the why):
  1. random weights with scales chosen so that activations stay O(1) through the layers;
  2. every linear weight that the published checkpoints store as FP8 is quantized to
     float8_e4m3fn with 128x128 blocks (scale_inv = amax(block)/448 in float32, partial
     blocks at the edges); embeddings, lm_head, norms and the router stay BF16, the router's
     e_score_correction_bias F32;
  3. the shards are written, then READ BACK from disk and dequantized in float64
     (codes * scale_inv per block; bf16 -> float64 exactly) into DeepseekV3ForCausalLM
     (eager attention, eager experts), checking that every checkpoint tensor lands in the
     model and every model parameter is set;
  4. one forward pass over the prompt gives ref_logits; greedy decoding gives 8 more ids;
  5. a seed is rejected (and the next one tried) when any router decision (top-k expert or
     top-k group) has a relative margin below 1e-4, or any greedy step a top-2 gap below
     1e-3 x max|logit|: then a float32 implementation must take the same discrete choices.

NOTE: stock transformers computes RMSNorm, RoPE angles, the attention softmax and the router
in float32 even in a float64 model. The reference logits come from the same model with those
four places patched to float64 (same formulas, same order); the stock float64 run is made too,
its routing must agree exactly and its largest deviation is recorded in fixture.json
("stock_vs_f64_rel"). RoPE's inv_freq is taken as transformers computes it (float32 values).
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as mdl

BLOCK = 128
FP8_MAX = 448.0
ROUTER_MARGIN = 1e-4
GREEDY_GAP = 1e-3
TOLERANCE = 1e-4
N_GREEDY = 8
MAX_SEEDS = 40


# ---- fixture configurations --------------------------------------------------------------

def base_config(**kw):
    """A published-style config.json dict (DeepSeek-V3 field names), tiny geometry."""
    c = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "ep_size": 1,
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 256,
        "initializer_range": 0.02,
        "intermediate_size": 512,
        "kv_lora_rank": 64,
        "max_position_embeddings": 256,
        "moe_intermediate_size": 32,
        "moe_layer_freq": 1,
        "n_group": 1,
        "n_routed_experts": 8,
        "n_shared_experts": 1,
        "norm_topk_prob": True,
        "num_attention_heads": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "num_nextn_predict_layers": 0,
        "q_lora_rank": 96,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000,
        "routed_scaling_factor": 2.5,
        "scoring_func": "sigmoid",
        "tie_word_embeddings": False,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "torch_dtype": "bfloat16",
        "use_cache": True,
        "v_head_dim": 32,
        "vocab_size": 384,
    }
    c.update(kw)
    return c


QCFG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK]}

FIXTURES = {
    "groups": dict(
        cfg=base_config(hidden_size=256, num_hidden_layers=3, first_k_dense_replace=1,
                        n_routed_experts=32, n_group=4, topk_group=2, num_experts_per_tok=4,
                        n_shared_experts=1, moe_intermediate_size=16, intermediate_size=256,
                        q_lora_rank=96, kv_lora_rank=64, num_attention_heads=4,
                        num_key_value_heads=4, vocab_size=256),
        T=48, seed=1000, shards=3,
        notes="n_group 4 / topk_group 2 group-limited routing, 32 experts top-4, 3 layers."),
    "many-experts": dict(
        cfg=base_config(hidden_size=128, num_hidden_layers=2, n_routed_experts=256,
                        n_group=1, topk_group=1, num_experts_per_tok=8,
                        moe_intermediate_size=8, intermediate_size=256, q_lora_rank=64,
                        kv_lora_rank=64, num_attention_heads=2, num_key_value_heads=2,
                        vocab_size=256, routed_scaling_factor=1.8),
        T=48, seed=2000, shards=2,
        notes="256 routed experts, top-8, one group."),
    "partial-blocks": dict(
        cfg=base_config(hidden_size=200, num_hidden_layers=2, n_routed_experts=8,
                        num_experts_per_tok=2, moe_intermediate_size=72, intermediate_size=300,
                        q_lora_rank=100, kv_lora_rank=72, num_attention_heads=3,
                        num_key_value_heads=3, qk_nope_head_dim=40, qk_rope_head_dim=16,
                        v_head_dim=48, vocab_size=320),
        T=56, seed=3000, shards=2,
        notes="every FP8 matrix has partial 128-blocks in rows and columns."),
    "long-yarn": dict(
        cfg=base_config(hidden_size=128, num_hidden_layers=2, n_routed_experts=8,
                        num_experts_per_tok=2, moe_intermediate_size=32, intermediate_size=256,
                        q_lora_rank=64, kv_lora_rank=64, num_attention_heads=2,
                        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
                        rope_scaling={"beta_fast": 32, "beta_slow": 1, "factor": 4,
                                      "mscale": 1.0, "mscale_all_dim": 1.0,
                                      "original_max_position_embeddings": 32,
                                      "type": "yarn"}),
        T=96, seed=4000, shards=2,
        notes="yarn rope (factor 4, original 32), prompt of 96 > 32 tokens."),
    "no-q-lora": dict(
        cfg=base_config(hidden_size=128, num_hidden_layers=2, n_routed_experts=16,
                        n_group=2, topk_group=1, num_experts_per_tok=3, n_shared_experts=2,
                        moe_intermediate_size=32, intermediate_size=256, q_lora_rank=None,
                        kv_lora_rank=64, num_attention_heads=2, num_key_value_heads=2,
                        vocab_size=256),
        T=50, seed=5000, shards=2,
        notes="q_lora_rank null (q_proj), 2 shared experts, n_group 2 / topk_group 1."),
    "hf-fp8": dict(
        cfg=base_config(hidden_size=128, num_hidden_layers=2, n_routed_experts=8,
                        num_experts_per_tok=2, moe_intermediate_size=128, intermediate_size=128,
                        q_lora_rank=128, kv_lora_rank=128, num_attention_heads=2,
                        num_key_value_heads=2, qk_nope_head_dim=64, qk_rope_head_dim=128,
                        v_head_dim=64, vocab_size=256),
        T=48, seed=6000, shards=0, hf_fp8=True,
        notes="checkpoint saved by transformers' own FineGrainedFP8Config path."),
}


# ---- weights ------------------------------------------------------------------------------

def fp8_weight_names(cfg):
    """Names of the linear weights the published checkpoints store as FP8, with [out, in]."""
    H = cfg["hidden_size"]
    nh = cfg["num_attention_heads"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    out = {}
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        if cfg["q_lora_rank"]:
            out[p + "self_attn.q_a_proj.weight"] = (cfg["q_lora_rank"], H)
            out[p + "self_attn.q_b_proj.weight"] = (nh * qk, cfg["q_lora_rank"])
        else:
            out[p + "self_attn.q_proj.weight"] = (nh * qk, H)
        out[p + "self_attn.kv_a_proj_with_mqa.weight"] = (
            cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], H)
        out[p + "self_attn.kv_b_proj.weight"] = (
            nh * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), cfg["kv_lora_rank"])
        out[p + "self_attn.o_proj.weight"] = (H, nh * cfg["v_head_dim"])
        if L < cfg["first_k_dense_replace"]:
            I = cfg["intermediate_size"]
            out[p + "mlp.gate_proj.weight"] = (I, H)
            out[p + "mlp.up_proj.weight"] = (I, H)
            out[p + "mlp.down_proj.weight"] = (H, I)
        else:
            I = cfg["moe_intermediate_size"]
            for e in range(cfg["n_routed_experts"]):
                q = p + f"mlp.experts.{e}."
                out[q + "gate_proj.weight"] = (I, H)
                out[q + "up_proj.weight"] = (I, H)
                out[q + "down_proj.weight"] = (H, I)
            Is = I * cfg["n_shared_experts"]
            out[p + "mlp.shared_experts.gate_proj.weight"] = (Is, H)
            out[p + "mlp.shared_experts.up_proj.weight"] = (Is, H)
            out[p + "mlp.shared_experts.down_proj.weight"] = (H, Is)
    return out


def make_weights(cfg, gen):
    """Random weights in checkpoint naming, float32 (FP8 ones) or their stored dtype."""
    H = cfg["hidden_size"]
    V = cfg["vocab_size"]
    w = {}

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float32) * std

    def norm(n):
        # NOTE: not all ones, so that a missing norm weight shows in the logits.
        return (1.0 + 0.1 * randn(n)).to(torch.bfloat16)

    w["model.embed_tokens.weight"] = randn(V, H).to(torch.bfloat16)
    fp8 = fp8_weight_names(cfg)
    for L in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{L}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        if cfg["q_lora_rank"]:
            w[p + "self_attn.q_a_layernorm.weight"] = norm(cfg["q_lora_rank"])
        w[p + "self_attn.kv_a_layernorm.weight"] = norm(cfg["kv_lora_rank"])
        if L >= cfg["first_k_dense_replace"]:
            E = cfg["n_routed_experts"]
            w[p + "mlp.gate.weight"] = randn(E, H, std=1.5 / math.sqrt(H)).to(torch.bfloat16)
            # NOTE: small and >= 0, so that biased scores stay positive (as published).
            w[p + "mlp.gate.e_score_correction_bias"] = (
                torch.rand(E, generator=gen, dtype=torch.float32) * 0.05)
    for name, (rows, cols) in fp8.items():
        std = 1.0 / math.sqrt(cols)
        if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
            std *= 0.7
        w[name] = randn(rows, cols, std=std)
    w["model.norm.weight"] = norm(H)
    w["lm_head.weight"] = randn(V, H, std=2.0 / math.sqrt(H)).to(torch.bfloat16)
    return w, set(fp8)


def quantize_fp8(W):
    """[rows, cols] float32 -> (float8_e4m3fn codes, float32 scale_inv [ceil r/128, ceil c/128])."""
    rows, cols = W.shape
    br, bc = -(-rows // BLOCK), -(-cols // BLOCK)
    scale = torch.empty(br, bc, dtype=torch.float32)
    codes = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(br):
        for j in range(bc):
            blk = W[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK]
            amax = blk.abs().max()
            s = (amax / FP8_MAX).to(torch.float32)
            assert float(s) > 0.0
            q = torch.clamp(blk / s, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
            codes[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = q
            scale[i, j] = s
    assert not torch.isnan(codes.to(torch.float32)).any()
    return codes, scale


def dequantize_fp8(codes, scale, block):
    """codes [..., rows, cols] FP8, scale [..., ceil r/b0, ceil c/b1] -> float64, exactly."""
    rows, cols = codes.shape[-2:]
    b0, b1 = block
    s = scale.to(torch.float64)
    s = s.repeat_interleave(b0, dim=-2)[..., :rows, :]
    s = s.repeat_interleave(b1, dim=-1)[..., :cols]
    return codes.to(torch.float64) * s


# ---- checkpoint writing and reading ----------------------------------------------------------

def write_checkpoint(d, cfg, tensors, n_shards):
    """Published layout: config.json, index, model-0000i-of-0000n.safetensors."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    names = list(tensors)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    per = total / n_shards
    shards, cur, acc = [], [], 0
    for n in names:
        cur.append(n)
        acc += tensors[n].numel() * tensors[n].element_size()
        if acc >= per * (len(shards) + 1) and len(shards) < n_shards - 1:
            shards.append(cur)
            cur = []
    shards.append(cur)
    if len(shards) != n_shards or not all(shards):
        k = -(-len(names) // n_shards)
        shards = [names[i:i + k] for i in range(0, len(names), k)]
    assert len(shards) == n_shards and all(shards)
    wmap = {}
    for i, group in enumerate(shards):
        fn = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({n: tensors[n].contiguous() for n in group}, os.path.join(d, fn),
                  metadata={"format": "pt"})
        for n in group:
            wmap[n] = fn
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=2,
                  sort_keys=True)
        f.write("\n")


def read_checkpoint(d):
    """Every tensor of the checkpoint in DIR, as stored (via the index, or one file)."""
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            wmap = json.load(f)["weight_map"]
        files = sorted(set(wmap.values()))
    else:
        wmap, files = None, ["model.safetensors"]
    out = {}
    for fn in files:
        with safe_open(os.path.join(d, fn), framework="pt") as f:
            for n in f.keys():
                assert n not in out, f"{n} in two shards"
                if wmap is not None:
                    assert wmap.get(n) == fn, f"{n}: index says {wmap.get(n)}, found in {fn}"
                out[n] = f.get_tensor(n)
    if wmap is not None:
        assert set(wmap) == set(out), "index and shards disagree"
    return out


def dequantize_checkpoint(sd, block):
    """Stored tensors -> float64 tensors by name (scale_inv folded into its weight).
    Returns (dict, summary of stored dtypes)."""
    out, used, kinds = {}, set(), {}
    for n, t in sd.items():
        if n.endswith("_scale_inv"):
            continue
        if n.endswith(".weight"):
            sn = n[: -len("weight")] + "weight_scale_inv"
        else:
            sn = n + "_scale_inv"
        if t.dtype == torch.float8_e4m3fn:
            assert sn in sd, f"{n}: FP8 without {sn}"
            s = sd[sn]
            assert s.dtype == torch.float32, f"{sn}: dtype {s.dtype}"
            want = tuple(t.shape[:-2]) + (-(-t.shape[-2] // block[0]), -(-t.shape[-1] // block[1]))
            if tuple(s.shape) != want:
                # NOTE: recorded, not hidden: transformers 5.17 saved some per-expert scales
                # squeezed ([2] for a [2, 1] block grid); same numbers, block-major order.
                assert s.numel() == math.prod(want), f"{sn}: shape {tuple(s.shape)} vs {want}"
                odd = kinds.setdefault("scale_shape_anomalies", [])
                if len(odd) < 8:
                    odd.append(f"{sn}: stored {list(s.shape)}, block grid {list(want)}")
                s = s.reshape(want)
            out[n] = dequantize_fp8(t, s, block)
            used.add(sn)
        else:
            assert sn not in sd, f"{sn} beside a non-FP8 tensor {n} ({t.dtype})"
            out[n] = t.to(torch.float64)
        used.add(n)
        kinds[str(t.dtype)] = kinds.get(str(t.dtype), 0) + 1
    if "scale_shape_anomalies" in kinds:
        print("  scale shapes: " + "; ".join(kinds["scale_shape_anomalies"][:3]), flush=True)
    missing = set(sd) - used
    assert not missing, f"stored tensors not used: {sorted(missing)[:5]}"
    return out, kinds


# ---- the transformers model -----------------------------------------------------------------

def hf_config(d):
    try:
        cfg = DeepseekV3Config.from_pretrained(d)
    except Exception as e:  # noqa: BLE001 - a strict config may refuse published extra keys
        print(f"  config.json as published refused ({type(e).__name__}: {e}); filtering keys")
        with open(os.path.join(d, "config.json")) as f:
            raw = json.load(f)
        known = set(getattr(DeepseekV3Config, "__dataclass_fields__", {})) | {
            "rope_scaling", "rope_theta", "quantization_config", "num_nextn_predict_layers"}
        cfg = DeepseekV3Config(**{k: v for k, v in raw.items() if k in known})
    if getattr(cfg, "quantization_config", None) is not None:
        # NOTE: the weights are dequantized by this script; the model is built unquantized.
        del cfg.quantization_config
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    return cfg


def load_model(cfg, w64):
    """DeepseekV3ForCausalLM in float64 with the checkpoint's dequantized weights.
    Per-expert weights are stacked into the fused 3D parameters; strict load plus a
    bitwise check prove every parameter was set and every tensor used."""
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(cfg).to(torch.float64).eval()
    for fn in ("set_attn_implementation", "set_experts_implementation"):
        if hasattr(model, fn):
            try:
                getattr(model, fn)("eager")
            except Exception as e:  # noqa: BLE001 - recorded, checked below
                print(f"  {fn}: {e}")
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    assert model.config._experts_implementation == "eager", model.config._experts_implementation
    target, used = {}, set()
    for n, t in w64.items():
        if ".mlp.experts." in n and n.split(".mlp.experts.")[1].split(".")[0].isdigit():
            continue
        target[n] = t
        used.add(n)
    E = cfg.n_routed_experts
    for L in range(cfg.num_hidden_layers):
        p = f"model.layers.{L}.mlp.experts."
        if f"{p}0.gate_proj.weight" in w64:
            g = [w64[f"{p}{e}.gate_proj.weight"] for e in range(E)]
            u = [w64[f"{p}{e}.up_proj.weight"] for e in range(E)]
            dn = [w64[f"{p}{e}.down_proj.weight"] for e in range(E)]
            target[p + "gate_up_proj"] = torch.stack([torch.cat([a, b], 0) for a, b in zip(g, u)])
            target[p + "down_proj"] = torch.stack(dn)
            for e in range(E):
                for k in ("gate_proj", "up_proj", "down_proj"):
                    used.add(f"{p}{e}.{k}.weight")
    unused = set(w64) - used
    assert not unused, f"checkpoint tensors not mapped: {sorted(unused)[:5]}"
    sd = model.state_dict()
    extra = set(target) - set(sd)
    missing = set(sd) - set(target)
    assert not extra, f"checkpoint tensors with no model parameter: {sorted(extra)[:5]}"
    assert not missing, f"model parameters not in the checkpoint: {sorted(missing)[:5]}"
    for n, t in target.items():
        assert tuple(sd[n].shape) == tuple(t.shape), f"{n}: {tuple(sd[n].shape)} vs {tuple(t.shape)}"
    model.load_state_dict(target, strict=True)
    sd = model.state_dict()
    for n, t in target.items():
        assert sd[n].dtype == torch.float64 and torch.equal(sd[n], t), f"{n} did not land"
    return model


# ---- float64 patches (see the NOTE at the top) ---------------------------------------------

def _rms64(self, x):
    var = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(var + self.variance_epsilon))


@torch.no_grad()
def _rope64(self, x, position_ids):
    inv = self.inv_freq.to(torch.float64)
    freqs = position_ids.to(torch.float64)[:, :, None] * inv[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return ((emb.cos() * self.attention_scaling).to(x.dtype),
            (emb.sin() * self.attention_scaling).to(x.dtype))


def _eager64(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    k = mdl.repeat_kv(key, module.num_key_value_groups)
    v = mdl.repeat_kv(value, module.num_key_value_groups)
    s = torch.matmul(query, k.transpose(2, 3)) * scaling
    if attention_mask is not None:
        s = s + attention_mask
    p = F.softmax(s, dim=-1, dtype=torch.float64).to(query.dtype)
    o = torch.matmul(p, v).transpose(1, 2).contiguous()
    return o, p


def _router64(self, hidden_states):
    h = hidden_states.view(-1, self.hidden_dim).to(torch.float64)
    logits = F.linear(h, self.weight.to(torch.float64))
    scores = logits.sigmoid()
    sfc = scores + self.e_score_correction_bias.to(torch.float64)
    g = sfc.view(-1, self.num_group, self.num_experts // self.num_group).topk(2, dim=-1)[0].sum(-1)
    gidx = torch.topk(g, k=self.topk_group, dim=-1, sorted=False)[1]
    gmask = torch.zeros_like(g).scatter_(1, gidx, 1)
    smask = gmask.unsqueeze(-1).expand(-1, self.num_group, self.num_experts // self.num_group)
    sfc = sfc.masked_fill(~smask.reshape(-1, self.num_experts).bool(), float("-inf"))
    idx = torch.topk(sfc, k=self.top_k, dim=-1, sorted=False)[1]
    wts = scores.gather(1, idx)
    if self.norm_topk_prob:
        wts = wts / (wts.sum(dim=-1, keepdim=True) + 1e-20)
    return logits, wts * self.routed_scaling_factor, idx


_ORIG = {}


def set_f64(on):
    if not _ORIG:
        _ORIG.update(rms=mdl.DeepseekV3RMSNorm.forward, rope=mdl.DeepseekV3RotaryEmbedding.forward,
                     eager=mdl.eager_attention_forward, router=mdl.DeepseekV3TopkRouter.forward)
    mdl.DeepseekV3RMSNorm.forward = _rms64 if on else _ORIG["rms"]
    mdl.DeepseekV3RotaryEmbedding.forward = _rope64 if on else _ORIG["rope"]
    mdl.eager_attention_forward = _eager64 if on else _ORIG["eager"]
    mdl.DeepseekV3TopkRouter.forward = _router64 if on else _ORIG["router"]


# ---- router margins -------------------------------------------------------------------------

class RouterWatch:
    """Forward hooks on every router: recomputes the decision in float64 from the router's
    input, checks it equals what the model chose, and tracks the smallest relative margins."""

    def __init__(self, model):
        self.min_expert = math.inf
        self.min_group = math.inf
        self.mismatch = 0
        self.calls = 0
        self.choices = []
        self.handles = [m.register_forward_hook(self.hook) for m in model.modules()
                        if isinstance(m, mdl.DeepseekV3TopkRouter)]
        assert self.handles, "no router found"

    def hook(self, mod, inputs, output):
        h = inputs[0].reshape(-1, mod.hidden_dim).to(torch.float64)
        s = torch.sigmoid(h @ mod.weight.to(torch.float64).t())
        b = s + mod.e_score_correction_bias.to(torch.float64)
        G, E, K, TG = mod.num_group, mod.num_experts, mod.top_k, mod.topk_group
        chosen = []
        for t in range(b.shape[0]):
            row = b[t]
            elig = torch.ones(E, dtype=torch.bool)
            if G > 1:
                gs = row.view(G, E // G).topk(2)[0].sum(-1)
                order = torch.sort(gs, descending=True)[0]
                self.min_group = min(self.min_group,
                                     float((order[TG - 1] - order[TG]) / order[TG - 1].abs()))
                keep = torch.topk(gs, TG)[1]
                gm = torch.zeros(G, dtype=torch.bool)
                gm[keep] = True
                elig = gm.repeat_interleave(E // G)
            vals = row[elig]
            order = torch.sort(vals, descending=True)[0]
            if vals.numel() > K:
                self.min_expert = min(self.min_expert,
                                      float((order[K - 1] - order[K]) / order[K - 1].abs()))
            pick = torch.topk(row.masked_fill(~elig, -math.inf), K)[1]
            chosen.append(sorted(pick.tolist()))
        got = [sorted(r) for r in output[2].tolist()]
        if got != chosen:
            self.mismatch += 1
        self.choices.append(got)
        self.calls += 1

    def close(self):
        for hd in self.handles:
            hd.remove()


# ---- one fixture -----------------------------------------------------------------------------

def run_model(model, prompt):
    """Prompt logits [T, V] and greedy ids (full recompute each step), plus min greedy gap."""
    with torch.no_grad():
        ids = torch.tensor([prompt], dtype=torch.long)
        logits = model(input_ids=ids, use_cache=False).logits[0]
        seq = list(prompt)
        greedy, gap = [], math.inf
        for _ in range(N_GREEDY):
            row = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            top = torch.topk(row, 2)
            gap = min(gap, float((top.values[0] - top.values[1]) / row.abs().max()))
            nxt = int(top.indices[0])
            greedy.append(nxt)
            seq.append(nxt)
    return logits, greedy, gap


def reference(d, prompt):
    """Reads the checkpoint in DIR back, runs stock and float64-patched transformers.
    Returns (logits64, greedy, info) or raises Reject / AssertionError."""
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    qc = cj.get("quantization_config") or {}
    block = tuple(qc.get("weight_block_size", [BLOCK, BLOCK]))
    sd = read_checkpoint(d)
    w64, kinds = dequantize_checkpoint(sd, block)
    cfg = hf_config(d)
    model = load_model(cfg, w64)
    info = {"stored_dtypes": kinds, "rope_parameters": dict(cfg.rope_parameters),
            "n_tensors": len(sd)}

    set_f64(False)
    watch = RouterWatch(model)
    stock, stock_greedy, _ = run_model(model, prompt)
    watch.close()
    set_f64(True)
    watch64 = RouterWatch(model)
    logits, greedy, gap = run_model(model, prompt)
    watch64.close()
    set_f64(False)

    info["min_router_margin_rel"] = watch64.min_expert
    info["min_group_margin_rel"] = watch64.min_group if watch64.min_group < math.inf else None
    info["min_greedy_gap_rel"] = gap
    rel = float(((stock - logits).abs().max(dim=-1).values / logits.abs().max(dim=-1).values).max())
    info["stock_vs_f64_rel"] = rel
    info["max_abs_logit"] = float(logits.abs().max())
    info["logit_row_std"] = float(logits.std(dim=-1).mean())
    if watch64.mismatch or watch.mismatch:
        raise Reject(f"router recomputation disagrees ({watch.mismatch}/{watch64.mismatch})")
    if watch.choices != watch64.choices:
        raise Reject("stock and float64 routing differ")
    if watch64.min_expert < ROUTER_MARGIN or watch64.min_group < ROUTER_MARGIN:
        raise Reject(f"router margin {watch64.min_expert:.3g} / group {watch64.min_group:.3g}")
    if gap <= GREEDY_GAP:
        raise Reject(f"greedy top-2 gap {gap:.3g}")
    if stock_greedy != greedy:
        raise Reject("stock and float64 greedy differ")
    if not torch.isfinite(logits).all():
        raise Reject("non-finite logits")
    # Cross-check: transformers' own cached greedy generation agrees with the recompute.
    try:
        set_f64(True)
        with torch.no_grad():
            g = model.generate(torch.tensor([prompt]), max_new_tokens=N_GREEDY, do_sample=False,
                               min_new_tokens=N_GREEDY, eos_token_id=None, pad_token_id=0)
        info["hf_generate_agrees"] = g[0, len(prompt):].tolist() == greedy
    except Exception as e:  # noqa: BLE001 - informative only
        info["hf_generate_agrees"] = f"not run: {type(e).__name__}: {e}"[:200]
    finally:
        set_f64(False)
    return logits, greedy, info


class Reject(Exception):
    pass


def make_plain(out, name, spec):
    cfg = dict(spec["cfg"])
    cfg["quantization_config"] = QCFG
    for k in [k for k, v in cfg.items() if v is None]:
        if k != "q_lora_rank":
            del cfg[k]
    d = os.path.join(out, name)
    for seed in range(spec["seed"], spec["seed"] + MAX_SEEDS):
        gen = torch.Generator().manual_seed(seed)
        w, fp8 = make_weights(cfg, gen)
        prompt = torch.randint(0, cfg["vocab_size"], (spec["T"],), generator=gen).tolist()
        tensors = {}
        for n, t in w.items():
            if n in fp8:
                codes, scale = quantize_fp8(t)
                tensors[n] = codes
                tensors[n[: -len("weight")] + "weight_scale_inv"] = scale
            else:
                tensors[n] = t
        if os.path.isdir(d):
            for fn in os.listdir(d):
                os.remove(os.path.join(d, fn))
        write_checkpoint(d, cfg, tensors, spec["shards"])
        try:
            logits, greedy, info = reference(d, prompt)
        except Reject as e:
            print(f"  {name}: seed {seed} rejected: {e}", flush=True)
            continue
        return finish(d, name, spec, seed, prompt, logits, greedy, info, spec["notes"])
    raise RuntimeError(f"{name}: no seed in {MAX_SEEDS} passed")


def make_hf_fp8(out, name, spec):
    from transformers import FineGrainedFP8Config
    cfg = dict(spec["cfg"])
    d = os.path.join(out, name)
    for seed in range(spec["seed"], spec["seed"] + MAX_SEEDS):
        gen = torch.Generator().manual_seed(seed)
        w, _ = make_weights(cfg, gen)
        prompt = torch.randint(0, cfg["vocab_size"], (spec["T"],), generator=gen).tolist()
        with tempfile.TemporaryDirectory() as tmp:
            bf = os.path.join(tmp, "bf16")
            os.makedirs(bf)
            with open(os.path.join(bf, "config.json"), "w") as f:
                json.dump(cfg, f)
            hcfg = hf_config(bf)
            w64 = {n: t.to(torch.bfloat16).to(torch.float64) for n, t in w.items()}
            m = load_model(hcfg, w64).to(torch.bfloat16)
            for mod in m.modules():  # the correction bias stays F32, as published
                if isinstance(mod, mdl.DeepseekV3TopkRouter):
                    mod.e_score_correction_bias.data = mod.e_score_correction_bias.data.float()
            m.save_pretrained(bf)
            del m
            q = DeepseekV3ForCausalLM.from_pretrained(
                bf, quantization_config=FineGrainedFP8Config(), dtype=torch.bfloat16,
                device_map="cuda")
            if os.path.isdir(d):
                for fn in os.listdir(d):
                    os.remove(os.path.join(d, fn))
            q.save_pretrained(d, max_shard_size="400KB")
            del q
        for fn in list(os.listdir(d)):
            if fn not in ("config.json", "model.safetensors.index.json") and \
               not fn.endswith(".safetensors"):
                os.remove(os.path.join(d, fn))  # generation_config.json etc.
        sd = read_checkpoint(d)
        with open(os.path.join(d, "config.json")) as f:
            saved_cfg = json.load(f)
        names = sorted(sd)
        fused = [n for n in names if n.endswith("experts.gate_up_proj") or
                 n.endswith("experts.down_proj")]
        per_expert = [n for n in names if ".mlp.experts.0.gate_proj.weight" in n]
        layout = ("fused 3D experts (" + ", ".join(fused[:2]) + ")") if fused else \
                 ("per-expert names as published" if per_expert else "no experts found")
        fp8_names = [n for n in names if sd[n].dtype == torch.float8_e4m3fn]
        notes = (spec["notes"] + f" transformers {transformers.__version__} saved: {layout}; "
                 f"{len(fp8_names)} FP8 tensors of {len(names)}; quantization_config "
                 f"{json.dumps(saved_cfg.get('quantization_config'))}.")
        try:
            logits, greedy, info = reference(d, prompt)
        except Reject as e:
            print(f"  {name}: seed {seed} rejected: {e}", flush=True)
            continue
        odd = info["stored_dtypes"].get("scale_shape_anomalies")
        if odd:
            notes += (" Some weight_scale_inv tensors are stored with a shape other than their"
                      " block grid (same element count), e.g. " + odd[0] + ".")
        info["saved_tensors"] = {n: [str(sd[n].dtype).replace("torch.", ""), list(sd[n].shape)]
                                 for n in names}
        return finish(d, name, spec, seed, prompt, logits, greedy, info, notes)
    raise RuntimeError(f"{name}: no seed in {MAX_SEEDS} passed")


def finish(d, name, spec, seed, prompt, logits, greedy, info, notes):
    np.save(os.path.join(d, "ref_logits.npy"), logits.numpy().astype(np.float64))
    fx = {"prompt": prompt, "greedy": greedy, "tolerance": TOLERANCE, "notes": notes,
          "seed": seed, "n_prompt": len(prompt), "vocab_size": int(logits.shape[1]),
          "transformers": transformers.__version__, "torch": torch.__version__}
    fx.update(info)
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fx, f, indent=1)
        f.write("\n")
    print(f"  {name}: seed {seed} ok: router margin {info['min_router_margin_rel']:.3g}, group "
          f"{info['min_group_margin_rel']}, greedy gap {info['min_greedy_gap_rel']:.3g}, "
          f"stock vs f64 {info['stock_vs_f64_rel']:.3g}, max|logit| {info['max_abs_logit']:.3g},"
          f" generate agrees {info['hf_generate_agrees']}", flush=True)
    return fx


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}", flush=True)
    os.makedirs(a.out, exist_ok=True)
    failed = []
    for name, spec in FIXTURES.items():
        if a.only and name not in a.only:
            continue
        t0 = time.time()
        print(f"{name}:", flush=True)
        try:
            if spec.get("hf_fp8"):
                make_hf_fp8(a.out, name, spec)
            else:
                make_plain(a.out, name, spec)
        except Exception:  # noqa: BLE001 - one fixture's failure must not stop the others
            traceback.print_exc()
            failed.append(name)
        print(f"  {name}: {time.time() - t0:.1f} s", flush=True)
    if failed:
        print("FAILED: " + " ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
