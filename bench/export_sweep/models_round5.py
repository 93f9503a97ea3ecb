"""The fifth round's model lists: transformers 5.25 architectures no earlier round covers (recent LLM
families, MLA and MoE decoders, linear-attention hybrids, newer encoders, encoder-decoders, vision
backbones), patched into export_all.py's text_models/image_models (same pattern as models_round4.py):
    SWEEP_OUT=/tmp/sweep5 python bench/export_sweep/models_round5.py [--only NAME ...]
then run_sweep.py as for export_all.py; fresh (default init): fresh_sweep.py --groups r5.

MoE decoders use experts_implementation="batched_mm" (round 4: the default grouped_mm has no ONNX
translation, eager routes through NonZero). BART-style encoder-decoders get models_round4.EosAtEnd.

Absent from transformers 5.25 (no class): MambaForSequenceClassification, CohereForSequenceClassification,
GraniteForSequenceClassification, Cohere2ForSequenceClassification, Lfm2ForSequenceClassification,
ErnieMForSequenceClassification, VanForImageClassification, NatForImageClassification,
EfficientFormerForImageClassification, ViTHybridForImageClassification.
Left out: Siglip2ForImageClassification (takes patchified pixel_values + pixel_attention_mask +
spatial_shapes, not an image), ImageGPTForImageClassification (takes colour-cluster token ids),
MobileViTV2ForImageClassification (fails in PyTorch at 32x32, models_round4.py), Dinat (needs natten),
TimmWrapperForImageClassification (the timm group), Gemma3/ShieldGemma2/ModernVBert/UltraVBert
(multimodal), LayoutLM/LayoutLMv2/LayoutLMv3/Lilt/MarkupLM/Tapas/Luke (layout boxes, xpaths, table or
entity inputs), audio classifiers (Wav2Vec2*, Hubert, WavLM, SEW*, UniSpeech*, Data2VecAudio),
Mra (custom CUDA kernels), IBert/Camembert/Flaubert/Xmod/RoCBert (covered architectures under another
name or extra inputs), Jamba/Zamba/Zamba2/MiniMax (SSM / lightning-attention hybrids: slow-path scans,
left for a later round), Mistral4/AXK1/AXK2 (DeepSeek-V3-style MLA + MoE, as deepseek_v3 here),
CohereCompassText (an embedding model with its own pooling; left for a later round), Perceiver,
MT5 (mt5_encoder in round 3). No *ForCausalLM: fresh_sweep.py gives a round's text models sequence labels
(models_lm.py holds the token-level heads)."""
import torch.nn as nn

import export_all as E
from models_round4 import EncDecLastPool, EosAtEnd

V = E.VOCAB


class EncoderMeanPool(nn.Module):
    """an encoder-only base model + masked mean pool + linear head (models_round3.T5EncoderClassifier for
    any encoder: UMT5ForSequenceClassification gathers the <eos> states through NonZero)."""

    def __init__(self, encoder, width):
        super().__init__()
        self.encoder = encoder
        self.config = encoder.config
        self.head = nn.Linear(width, 2)

    def forward(self, input_ids, attention_mask, return_dict=False):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (self.head((h * m).sum(1) / m.sum(1)),)


def text_models():
    import transformers as X
    common, dec = E.ENCODER, E.DECODER
    moe = dict(experts_implementation="batched_mm")
    mla = dict(kv_lora_rank=16, q_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16)
    dec2 = dict(dec, num_key_value_heads=2)  # MLA: one key/value head per query head
    bart = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, classifier_dropout=0.0,
                init_std=0.2, num_labels=2, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                decoder_start_token_id=2)
    t5g = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
               num_key_value_heads=1, head_dim=16, max_position_embeddings=64, initializer_range=0.2,
               query_pre_attn_scalar=16, sliding_window=8, attention_dropout=0.0, pad_token_id=0, eos_token_id=1,
               bos_token_id=2)
    return {
        # ---- LLM-style decoders
        "glm4": lambda: X.Glm4ForSequenceClassification(X.Glm4Config(head_dim=16, **dec)),
        "olmo3": lambda: X.Olmo3ForSequenceClassification(X.Olmo3Config(sliding_window=8, **dec)),
        "ministral": lambda: X.MinistralForSequenceClassification(X.MinistralConfig(
            head_dim=16, sliding_window=8, **dec)),
        "ministral3": lambda: X.Ministral3ForSequenceClassification(X.Ministral3Config(head_dim=16, **dec)),
        "seed_oss": lambda: X.SeedOssForSequenceClassification(X.SeedOssConfig(
            head_dim=16, residual_dropout=0.0, attention_bias=True, **dec)),
        "hunyuan_dense": lambda: X.HunYuanDenseV1ForSequenceClassification(X.HunYuanDenseV1Config(
            head_dim=16, **dec)),
        # differential attention splits the value heads in two: at least 2 key/value heads
        "diffllama": lambda: X.DiffLlamaForSequenceClassification(X.DiffLlamaConfig(head_dim=16, **dec2)),
        "doge": lambda: X.DogeForSequenceClassification(X.DogeConfig(
            hidden_dropout=0.0, keep_window_size=8, is_moe=False, **dec)),
        "openai_gpt": lambda: X.OpenAIGPTForSequenceClassification(X.OpenAIGPTConfig(
            vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0, summary_first_dropout=0.0, initializer_range=0.2, num_labels=2, pad_token_id=0)),
        "modernbert_decoder": lambda: X.ModernBertDecoderForSequenceClassification(X.ModernBertDecoderConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, local_attention=8, initializer_range=0.2, num_labels=2, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
        # multi-head latent attention (low-rank q / kv, decoupled rope)
        "minicpm3": lambda: X.MiniCPM3ForSequenceClassification(X.MiniCPM3Config(
            head_dim=16, scale_emb=1.0, scale_depth=1.0, dim_model_base=32, **mla, **dec2)),
        # MoE (2 experts)
        "deepseek_v2": lambda: X.DeepseekV2ForSequenceClassification(X.DeepseekV2Config(
            n_routed_experts=2, n_shared_experts=1, num_experts_per_tok=1, moe_intermediate_size=32,
            first_k_dense_replace=1, n_group=1, topk_group=1, **mla, **moe, **dec2)),
        "deepseek_v3": lambda: X.DeepseekV3ForSequenceClassification(X.DeepseekV3Config(
            n_routed_experts=2, n_shared_experts=1, num_experts_per_tok=1, moe_intermediate_size=32,
            first_k_dense_replace=1, n_group=1, topk_group=1, **mla, **moe, **dec2)),
        "qwen3_moe": lambda: X.Qwen3MoeForSequenceClassification(X.Qwen3MoeConfig(
            head_dim=16, num_experts=2, num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1,
            norm_topk_prob=True, **moe, **dec)),
        "phimoe": lambda: X.PhimoeForSequenceClassification(X.PhimoeConfig(
            num_local_experts=2, num_experts_per_tok=2, router_jitter_noise=0.0, input_jitter_noise=0.0,
            **moe, **dec)),
        "gpt_oss": lambda: X.GptOssForSequenceClassification(X.GptOssConfig(
            head_dim=16, num_local_experts=2, num_experts_per_tok=2, sliding_window=8, **moe, **dec)),
        "hunyuan_moe": lambda: X.HunYuanMoEV1ForSequenceClassification(X.HunYuanMoEV1Config(
            head_dim=16, num_experts=2, moe_topk=1, **moe, **dec)),
        "jetmoe": lambda: X.JetMoeForSequenceClassification(X.JetMoeConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_key_value_heads=1, kv_channels=16,
            intermediate_size=64, max_position_embeddings=64, num_local_experts=2, num_experts_per_tok=2,
            initializer_range=0.2, num_labels=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        # gated-DeltaNet linear attention + full attention (the torch fallback, no fla / causal-conv1d)
        "qwen3_5_text": lambda: X.Qwen3_5TextForSequenceClassification(X.Qwen3_5TextConfig(
            head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=2, layer_types=["linear_attention", "full_attention"],
            **dec)),
        "qwen3_next": lambda: X.Qwen3NextForSequenceClassification(X.Qwen3NextConfig(
            head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
            linear_num_key_heads=2, linear_num_value_heads=2, layer_types=["linear_attention", "full_attention"],
            num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            decoder_sparse_step=1, **moe, **dec)),
        # ---- encoders
        "roberta_prelayernorm": lambda: X.RobertaPreLayerNormForSequenceClassification(
            X.RobertaPreLayerNormConfig(pad_token_id=1, **common)),
        "eurobert": lambda: X.EuroBertForSequenceClassification(X.EuroBertConfig(
            head_dim=16, mask_token_id=3, **dec)),
        "esmc": lambda: X.EsmcForSequenceClassification(X.EsmcConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, initializer_range=0.2, pad_token_id=1, bos_token_id=0, eos_token_id=2,
            mask_token_id=32, classifier_dropout=0.0, num_labels=2)),
        "ultrabert": lambda: X.UltrabertForSequenceClassification(X.UltrabertConfig(
            head_dim=16, sliding_window=8, prediction_head_size=32, classifier_dropout=0.0, **dec)),
        # ---- encoder-decoders (<eos> written at each row's end by EosAtEnd)
        "plbart": lambda: EosAtEnd(X.PLBartForSequenceClassification(X.PLBartConfig(**bart))),
        "mvp": lambda: EosAtEnd(X.MvpForSequenceClassification(X.MvpConfig(use_prompt=False, **bart))),
        "umt5": lambda: EosAtEnd(X.UMT5ForSequenceClassification(X.UMT5Config(
            vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
            dropout_rate=0.0, classifier_dropout=0.0, relative_attention_num_buckets=8,
            relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
            num_labels=2, initializer_factor=1.0))),
        "t5gemma": lambda: X.T5GemmaForSequenceClassification(X.T5GemmaConfig(
            encoder=X.T5GemmaModuleConfig(**t5g), decoder=X.T5GemmaModuleConfig(**t5g), vocab_size=V,
            dropout_rate=0.0, classifier_dropout_rate=0.0, attention_dropout=0.0, num_labels=2),
            is_encoder_decoder=False),
        # ---- second batch (added after the list above had run)
        # PLBart / MVP / UMT5 *ForSequenceClassification gather the <eos> states through NonZero (memc refuses
        # it, as BART in round 4): PLBart / MVP as the base model + the decoder state at each row's last
        # position (models_round4.EncDecLastPool), UMT5 as its encoder mean-pooled (EncoderMeanPool)
        "plbart_pooled": lambda: EncDecLastPool(X.PLBartModel(X.PLBartConfig(**bart))),
        "mvp_pooled": lambda: EncDecLastPool(X.MvpModel(X.MvpConfig(use_prompt=False, **bart))),
        "umt5_encoder": lambda: EncoderMeanPool(X.UMT5EncoderModel(X.UMT5Config(
            vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, dropout_rate=0.0,
            relative_attention_num_buckets=8, relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1,
            initializer_factor=1.0)), 32),
    }


def image_models():
    import transformers as X
    IMG = E.IMG
    swin = dict(image_size=IMG, patch_size=4, num_channels=3, embed_dim=16, depths=[2, 2], num_heads=[2, 2],
                window_size=4, mlp_ratio=2.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                drop_path_rate=0.0, num_labels=10, initializer_range=0.2)
    return {
        "swinv2": lambda: X.Swinv2ForImageClassification(X.Swinv2Config(**swin)),
        "donut_swin": lambda: X.DonutSwinForImageClassification(X.DonutSwinConfig(**swin)),
        "metaclip2": lambda: X.MetaClip2ForImageClassification(X.MetaClip2Config(
            vision_config=dict(image_size=IMG, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64, projection_dim=32, attention_dropout=0.0),
            text_config=dict(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64), num_labels=10)),
        "hgnet_v2": lambda: X.HGNetV2ForImageClassification(X.HGNetV2Config(
            num_channels=3, embedding_size=16, depths=[1, 1], hidden_sizes=[32, 64], stem_channels=[3, 8, 16],
            stage_in_channels=[16, 32], stage_mid_channels=[8, 16], stage_out_channels=[32, 64],
            stage_num_blocks=[1, 1], stage_downsample=[False, True], stage_downsample_strides=[2, 2],
            stage_light_block=[False, True], stage_kernel_size=[3, 3], stage_numb_of_layers=[2, 2],
            use_learnable_affine_block=True, num_labels=10, initializer_range=0.2)),
        # PP-LCNet / TextNet: no init of their own (PreTrainedModel's normal init); at 0.02 the fresh
        # model's logits are ~1e-18 / ~1e-5, so a wider initializer_range (logits ~0.8 / ~3)
        "pp_lcnet": lambda: X.PPLCNetForImageClassification(X.PPLCNetConfig(
            scale=0.25, stem_channels=16, class_expand=64, hidden_dropout_prob=0.0,
            block_configs=[[[3, 16, 32, 1, False]], [[3, 32, 64, 2, False]], [[3, 64, 64, 2, False]],
                           [[5, 64, 128, 2, True]], [[5, 128, 128, 1, True]]], num_labels=10,
            initializer_range=0.5)),
        "textnet": lambda: X.TextNetForImageClassification(X.TextNetConfig(
            stem_out_channels=8, image_size=(IMG, IMG), hidden_sizes=[8, 8, 16, 16, 32], num_labels=10,
            initializer_range=0.1)),
    }


E.text_models = text_models
E.image_models = image_models

if __name__ == "__main__":
    E.main()
