"""The third round's model lists (bench/journal/2026.md §46, §47): 33 more configurations, patched
into export_all.py's text_models/image_models:
    SWEEP_OUT=/tmp/sweep3 python bench/export_sweep/models_round3.py [--only NAME ...]
then run_sweep.py as for export_all.py."""
import export_all as E

V = E.VOCAB


def text_models():
    import transformers as X
    common, dec = E.ENCODER, E.DECODER
    return {
        # LLM-style decoders
        "phi": lambda: X.PhiForSequenceClassification(X.PhiConfig(resid_pdrop=0.0, embd_pdrop=0.0,
                                                                    attention_dropout=0.0, **dec)),
        "gemma2": lambda: X.Gemma2ForSequenceClassification(X.Gemma2Config(head_dim=16, sliding_window=8, **dec)),
        "gemma3_text": lambda: X.Gemma3TextForSequenceClassification(X.Gemma3TextConfig(
            head_dim=16, sliding_window=8, **dec)),
        "falcon": lambda: X.FalconForSequenceClassification(X.FalconConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, hidden_dropout=0.0,
            attention_dropout=0.0, initializer_range=0.2, num_labels=2, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, max_position_embeddings=64)),
        "gpt_neo": lambda: X.GPTNeoForSequenceClassification(X.GPTNeoConfig(
            vocab_size=V, max_position_embeddings=64, hidden_size=32, num_layers=2, num_heads=2,
            attention_types=[[["global", "local"], 1]], window_size=8, intermediate_size=64,
            embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0, initializer_range=0.2,
            num_labels=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "gptj": lambda: X.GPTJForSequenceClassification(X.GPTJConfig(
            vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2, rotary_dim=8, n_inner=64,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2, num_labels=2,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "bloom": lambda: X.BloomForSequenceClassification(X.BloomConfig(
            vocab_size=V, hidden_size=32, n_layer=2, n_head=2, hidden_dropout=0.0, attention_dropout=0.0,
            initializer_range=0.2, num_labels=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "stablelm": lambda: X.StableLmForSequenceClassification(X.StableLmConfig(**dec)),
        "olmo": lambda: X.OlmoForSequenceClassification(X.OlmoConfig(**dec)),
        "olmo2": lambda: X.Olmo2ForSequenceClassification(X.Olmo2Config(**dec)),
        # encoders
        "longformer": lambda: X.LongformerForSequenceClassification(X.LongformerConfig(
            attention_window=4, pad_token_id=1, bos_token_id=0, eos_token_id=2, **common)),
        "mobilebert": lambda: X.MobileBertForSequenceClassification(X.MobileBertConfig(
            vocab_size=V, hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, intra_bottleneck_size=16, true_hidden_size=16, num_feedforward_networks=2,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            classifier_dropout=0.0, initializer_range=0.2, num_labels=2, pad_token_id=0)),
        "funnel": lambda: X.FunnelForSequenceClassification(X.FunnelConfig(
            vocab_size=V, block_sizes=[1, 1], num_decoder_layers=1, d_model=32, n_head=2, d_head=16,
            d_inner=64, hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
            initializer_range=0.2, num_labels=2, pad_token_id=0)),
        "convbert": lambda: X.ConvBertForSequenceClassification(X.ConvBertConfig(
            embedding_size=32, head_ratio=2, conv_kernel_size=3, pad_token_id=0, **common)),
        "squeezebert": lambda: X.SqueezeBertForSequenceClassification(X.SqueezeBertConfig(
            embedding_size=32, q_groups=2, k_groups=2, v_groups=2, post_attention_groups=2,
            intermediate_groups=2, output_groups=2, pad_token_id=0, **common)),
        "nystromformer": lambda: X.NystromformerForSequenceClassification(X.NystromformerConfig(
            num_landmarks=4, segment_means_seq_len=16, conv_kernel_size=3, pad_token_id=0, **common)),
        # num_landmarks == seq: the eager Nystrom path (landmarks < seq) fails with an attention mask in transformers 5.25.0
        "nystromformer_full": lambda: X.NystromformerForSequenceClassification(X.NystromformerConfig(
            num_landmarks=16, segment_means_seq_len=16, conv_kernel_size=3, pad_token_id=0, **common)),
        "canine": lambda: X.CanineForSequenceClassification(X.CanineConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            downsampling_rate=4, num_hash_functions=2, num_hash_buckets=64, local_transformer_stride=4,
            initializer_range=0.2, num_labels=2, pad_token_id=0)),
        "t5": lambda: X.T5ForSequenceClassification(X.T5Config(
            vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
            dropout_rate=0.0, classifier_dropout=0.0, relative_attention_num_buckets=8,
            relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
            num_labels=2, initializer_factor=1.0)),
    }


def image_models():
    import transformers as X
    IMG = E.IMG
    vit = dict(image_size=IMG, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, num_labels=10, initializer_range=0.2)
    return {
        "clip": lambda: X.CLIPForImageClassification(X.CLIPConfig(
            vision_config=dict(image_size=IMG, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64, projection_dim=32, attention_dropout=0.0),
            text_config=dict(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64), num_labels=10)),
        "siglip": lambda: X.SiglipForImageClassification(X.SiglipConfig(
            vision_config=dict(image_size=IMG, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=2, intermediate_size=64, attention_dropout=0.0),
            text_config=dict(vocab_size=V, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=64), num_labels=10)),
        "data2vec_vision": lambda: X.Data2VecVisionForImageClassification(X.Data2VecVisionConfig(
            use_relative_position_bias=True, drop_path_rate=0.0, use_mean_pooling=True, **vit)),
        "levit": lambda: X.LevitForImageClassification(X.LevitConfig(
            image_size=IMG, num_channels=3, kernel_size=3, stride=2, padding=1, patch_size=16,
            hidden_sizes=[16, 32], num_attention_heads=[1, 2], depths=[1, 1], key_dim=[8, 8],
            drop_path_rate=0, mlp_ratio=[2, 2], attention_ratio=[2, 2],
            down_ops=[["Subsample", 8, 16 // 8, 4, 2, 2]], num_labels=10, initializer_range=0.2)),
        "pvt": lambda: X.PvtForImageClassification(X.PvtConfig(
            image_size=IMG, num_channels=3, num_encoder_blocks=2, depths=[1, 1], sequence_reduction_ratios=[2, 1],
            hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2], num_attention_heads=[1, 2],
            mlp_ratios=[2, 2], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
            num_labels=10, initializer_range=0.2)),
        "pvt_v2": lambda: X.PvtV2ForImageClassification(X.PvtV2Config(
            image_size=IMG, num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
            hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2],
            mlp_ratios=[2, 2], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0,
            num_labels=10, initializer_range=0.2)),
        "poolformer": lambda: X.PoolFormerForImageClassification(X.PoolFormerConfig(
            num_channels=3, patch_size=7, stride=4, num_encoder_blocks=2, depths=[1, 1],
            hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1], mlp_ratio=2.0,
            drop_path_rate=0.0, hidden_dropout_prob=0.0, num_labels=10, initializer_range=0.2)),
        "cvt": lambda: X.CvtForImageClassification(X.CvtConfig(  # depth[1]=2: transformers indexes drop_path_rates[stage]
            num_channels=3, patch_sizes=[7, 3], patch_stride=[4, 2], patch_padding=[2, 1], embed_dim=[16, 32],
            num_heads=[1, 2], depth=[1, 2], mlp_ratio=[2.0, 2.0], attention_drop_rate=[0.0, 0.0],
            drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.0], qkv_bias=[True, True], cls_token=[False, True],
            qkv_projection_method=["dw_bn", "dw_bn"], kernel_qkv=[3, 3], padding_kv=[1, 1], stride_kv=[2, 2],
            padding_q=[1, 1], stride_q=[1, 1], num_labels=10, initializer_range=0.2)),
        "segformer": lambda: X.SegformerForImageClassification(X.SegformerConfig(
            num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
            patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
            drop_path_rate=0.0, decoder_hidden_size=32, num_labels=10, initializer_range=0.2)),
        "bit": lambda: X.BitForImageClassification(X.BitConfig(
            num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="preactivation",
            global_padding=None, num_groups=8, drop_path_rate=0.0, out_features=None, num_labels=10)),
        "hiera": lambda: X.HieraForImageClassification(X.HieraConfig(
            image_size=[IMG, IMG], patch_size=[3, 3], patch_stride=[2, 2], patch_padding=[1, 1], embed_dim=16,
            num_heads=[1, 2], depths=[1, 1], embed_dim_multiplier=2.0, num_query_pool=1, query_stride=[2, 2],
            masked_unit_size=[4, 4], masked_unit_attention=[True, False], mlp_ratio=2.0, drop_path_rate=0.0,
            num_labels=10, initializer_range=0.2)),
        "focalnet": lambda: X.FocalNetForImageClassification(X.FocalNetConfig(
            image_size=IMG, patch_size=4, num_channels=3, embed_dim=16, depths=[1, 1], focal_levels=[2, 2],
            focal_windows=[3, 3], hidden_dropout_prob=0.0, drop_path_rate=0.0, mlp_ratio=2.0, num_labels=10,
            initializer_range=0.2)),
    }


class T5EncoderClassifier(__import__("torch").nn.Module):
    """T5EncoderModel + masked mean pool + linear head (T5ForSequenceClassification needs <eos> in
    every row and gathers by a boolean mask)."""

    def __init__(self, cfg):
        import torch.nn as nn
        import transformers as X
        super().__init__()
        self.config = cfg
        self.encoder = X.T5EncoderModel(cfg)
        self.head = nn.Linear(cfg.d_model, 2)

    def forward(self, input_ids, attention_mask, return_dict=False):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        return (self.head((h * m).sum(1) / m.sum(1)),)


def _t5_enc():
    import transformers as X
    return T5EncoderClassifier(X.T5Config(
        vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, dropout_rate=0.0,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1,
        initializer_factor=1.0))


def _t5_enc_gated():
    import transformers as X
    return T5EncoderClassifier(X.T5Config(
        vocab_size=V, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2, dropout_rate=0.0,
        relative_attention_num_buckets=8, relative_attention_max_distance=16, pad_token_id=0, eos_token_id=1,
        feed_forward_proj="gated-gelu", initializer_factor=1.0))


_tm = text_models


def text_models():
    d = _tm()
    d["t5_encoder"] = _t5_enc
    d["mt5_encoder"] = _t5_enc_gated  # MT5 = T5 v1.1 architecture (gated-gelu FFN); MT5Config equivalent
    return d


E.text_models = text_models
E.image_models = image_models

if __name__ == "__main__":
    E.main()
