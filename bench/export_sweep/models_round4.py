"""The fourth round's model lists: more transformers 5.25 architectures, patched into export_all.py's
text_models/image_models (same pattern as models_round3.py):
    SWEEP_OUT=/tmp/sweep4 python bench/export_sweep/models_round4.py [--only NAME ...]
then run_sweep.py as for export_all.py.

Absent from transformers 5.25 (no class): LEDForSequenceClassification, NezhaForSequenceClassification,
ErnieMForSequenceClassification, MambaForSequenceClassification, CohereForSequenceClassification,
GraniteForSequenceClassification, VanForImageClassification, NatForImageClassification,
EfficientFormerForImageClassification, ViTHybridForImageClassification. Dinat needs natten (not installed)."""
import torch
import torch.nn as nn

import export_all as E

V = E.VOCAB


class EosAtEnd(nn.Module):
    """BART-style *ForSequenceClassification pool the hidden state at the <eos> tokens and require the
    same number of <eos> in every row; the sweep's batches hold none. This wrapper writes <eos> at the
    last attended position of every row (in the graph), then calls the model unchanged."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask, return_dict=False):
        last = attention_mask.sum(1, keepdim=True) - 1
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        ids = torch.where(pos == last, torch.full_like(input_ids, self.config.eos_token_id), input_ids)
        return self.inner(input_ids=ids, attention_mask=attention_mask, return_dict=False)


class EncDecLastPool(nn.Module):
    """encoder-decoder base model fed decoder_input_ids = [<eos>, ids[:-1]] (computed by Concat); logits =
    Linear(decoder state at the row's last attended position)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.head = nn.Linear(inner.config.d_model, 2)

    def forward(self, input_ids, attention_mask, return_dict=False):
        start = torch.full_like(input_ids[:, :1], self.config.decoder_start_token_id)
        dec = torch.cat([start, input_ids[:, :-1]], dim=1)
        h = self.inner(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=dec,
                       return_dict=False)[0]
        last = (attention_mask.sum(1) - 1).view(-1, 1, 1).expand(-1, 1, h.shape[-1])
        return (self.head(torch.gather(h, 1, last)[:, 0]),)  # [:, 0], not squeeze(1): TorchScript makes squeeze of a dynamic dim an If


class TrainModeForBackward(nn.Module):
    """Reformer's reversible layers refuse backward in eval mode (an assertion in _ReversibleFunction.backward).
    For an eager forward with grad enabled (export_all.torch_ref) this wrapper runs the model in train mode,
    which with every dropout 0 computes the same function (the axial position embeddings then require
    seq == prod(axial_pos_shape) = 16: true for the reference batch). Exports and the no-grad second-shape
    reference run in eval mode as usual."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask, return_dict=False):
        grad_ref = torch.is_grad_enabled() and not torch.jit.is_tracing() and not torch.compiler.is_exporting()
        self.inner.train(grad_ref)  # left so until the next forward: backward checks the mode too
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)


class NoMask(nn.Module):
    """FNet*ForSequenceClassification takes no attention_mask (Fourier mixing over every position): the
    mask input is accepted and ignored."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config

    def forward(self, input_ids, attention_mask, return_dict=False):
        return self.inner(input_ids=input_ids, return_dict=False)


def text_models():
    import transformers as X
    common, dec = E.ENCODER, E.DECODER
    bart = dict(vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
                dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, classifier_dropout=0.0,
                init_std=0.2, num_labels=2, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                decoder_start_token_id=2)
    return {
        # encoders
        "xlnet": lambda: X.XLNetForSequenceClassification(X.XLNetConfig(
            vocab_size=V, d_model=32, n_layer=2, n_head=2, d_inner=64, dropout=0.0, summary_last_dropout=0.0,
            initializer_range=0.2, num_labels=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "deberta": lambda: X.DebertaForSequenceClassification(X.DebertaConfig(
            relative_attention=True, pos_att_type=["p2c", "c2p"], max_relative_positions=-1,
            position_biased_input=False, pooler_dropout=0.0, pad_token_id=0, **common)),
        "megatron_bert": lambda: X.MegatronBertForSequenceClassification(X.MegatronBertConfig(
            pad_token_id=0, **common)),
        "rembert": lambda: X.RemBertForSequenceClassification(X.RemBertConfig(
            input_embedding_size=16, output_embedding_size=16, classifier_dropout_prob=0.0, pad_token_id=0,
            bos_token_id=1, eos_token_id=2,
            **common)),
        "roformer": lambda: X.RoFormerForSequenceClassification(X.RoFormerConfig(
            embedding_size=32, pad_token_id=0, **common)),
        "ernie": lambda: X.ErnieForSequenceClassification(X.ErnieConfig(
            use_task_id=False, pad_token_id=0, **common)),
        # local-attention Reformer (LSH attention draws random rotations in every forward)
        "reformer": lambda: TrainModeForBackward(X.ReformerForSequenceClassification(X.ReformerConfig(
            vocab_size=V, hidden_size=32, num_attention_heads=2, attention_head_size=16, feed_forward_size=64,
            attn_layers=["local", "local"], local_attn_chunk_length=4, local_num_chunks_before=1,
            local_num_chunks_after=0, axial_pos_embds=True, axial_pos_shape=[4, 4], axial_pos_embds_dim=[16, 16],
            max_position_embeddings=16, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0,
            classifier_dropout=0.0, is_decoder=False, initializer_range=0.2, num_labels=2, pad_token_id=0,
            eos_token_id=2))),
        # encoder-decoders (<eos> written at each row's end by EosAtEnd)
        "bart": lambda: EosAtEnd(X.BartForSequenceClassification(X.BartConfig(**bart))),
        "mbart": lambda: EosAtEnd(X.MBartForSequenceClassification(X.MBartConfig(**bart))),
        # LLM-style decoders
        "starcoder2": lambda: X.Starcoder2ForSequenceClassification(X.Starcoder2Config(
            residual_dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0, use_bias=True, **dec)),
        # MoE: 2 experts; Mixtral routes top-2 (every expert used), Qwen2-MoE top-1 + shared expert
        "mixtral": lambda: X.MixtralForSequenceClassification(X.MixtralConfig(
            num_local_experts=2, num_experts_per_tok=2, router_jitter_noise=0.0, **dec)),
        "qwen2_moe": lambda: X.Qwen2MoeForSequenceClassification(X.Qwen2MoeConfig(
            num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            decoder_sparse_step=1, norm_topk_prob=False, **dec)),
        # the default experts implementation in 5.25 is grouped_mm (a transformers custom op with no
        # ONNX translation; TorchScript fails on aten::histc): the same models with the two others
        "mixtral_bmm": lambda: X.MixtralForSequenceClassification(X.MixtralConfig(
            num_local_experts=2, num_experts_per_tok=2, router_jitter_noise=0.0, experts_implementation="batched_mm",
            **dec)),
        "qwen2_moe_bmm": lambda: X.Qwen2MoeForSequenceClassification(X.Qwen2MoeConfig(
            num_experts=2, num_experts_per_tok=1, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            decoder_sparse_step=1, norm_topk_prob=False, experts_implementation="batched_mm", **dec)),
        "mixtral_eager": lambda: X.MixtralForSequenceClassification(X.MixtralConfig(
            num_local_experts=2, num_experts_per_tok=2, router_jitter_noise=0.0, experts_implementation="eager",
            **dec)),
        # BART/mBART without the boolean <eos> gather (NonZero) and without shift_tokens_right's
        # select_scatter: BartModel/MBartModel + the decoder state at each row's last position + a linear head
        "bart_pooled": lambda: EncDecLastPool(X.BartModel(X.BartConfig(**bart))),
        "mbart_pooled": lambda: EncDecLastPool(X.MBartModel(X.MBartConfig(**bart))),
        # ---- second batch (added after the list above had run; appended so the seeds above stay the same)
        "fnet": lambda: NoMask(X.FNetForSequenceClassification(X.FNetConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, intermediate_size=64, hidden_dropout_prob=0.0,
            max_position_embeddings=64, use_tpu_fourier_optimizations=False, initializer_range=0.2, num_labels=2,
            pad_token_id=0))),
        "esm": lambda: X.EsmForSequenceClassification(X.EsmConfig(
            mask_token_id=4, position_embedding_type="rotary", token_dropout=False, emb_layer_norm_before=False,
            pad_token_id=0, **common)),
        "xlm": lambda: X.XLMForSequenceClassification(X.XLMConfig(
            vocab_size=V, emb_dim=32, n_layers=2, n_heads=2, dropout=0.0, attention_dropout=0.0, n_langs=1,
            use_lang_emb=False, max_position_embeddings=64, summary_first_dropout=0.0, embed_init_std=0.2,
            init_std=0.2, pad_token_id=2, bos_token_id=0, eos_token_id=1, num_labels=2)),
        "xlm_roberta_xl": lambda: X.XLMRobertaXLForSequenceClassification(X.XLMRobertaXLConfig(
            pad_token_id=1, **common)),
        "data2vec_text": lambda: X.Data2VecTextForSequenceClassification(X.Data2VecTextConfig(
            pad_token_id=1, **common)),
        "yoso": lambda: X.YosoForSequenceClassification(X.YosoConfig(
            use_expectation=True, use_fast_hash=False, conv_window=None, num_hash=4, hash_code_len=4, pad_token_id=0,
            **common)),
        "biogpt": lambda: X.BioGptForSequenceClassification(X.BioGptConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, activation_dropout=0.0, layerdrop=0.0,
            max_position_embeddings=64, initializer_range=0.2, num_labels=2, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)),
        "ctrl": lambda: X.CTRLForSequenceClassification(X.CTRLConfig(
            vocab_size=V, n_positions=64, n_embd=32, dff=64, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
            initializer_range=0.2, num_labels=2, pad_token_id=0)),
        "gpt_neox": lambda: X.GPTNeoXForSequenceClassification(X.GPTNeoXConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            attention_dropout=0.0, hidden_dropout=0.0, classifier_dropout=0.0, max_position_embeddings=64,
            use_parallel_residual=True, initializer_range=0.2, num_labels=2, pad_token_id=0, bos_token_id=1,
            eos_token_id=2)),
        "gpt_bigcode": lambda: X.GPTBigCodeForSequenceClassification(X.GPTBigCodeConfig(
            vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2, n_inner=64, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, multi_query=True, initializer_range=0.2, num_labels=2, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)),
        "persimmon": lambda: X.PersimmonForSequenceClassification(X.PersimmonConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0,
            initializer_range=0.2, num_labels=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "nemotron": lambda: X.NemotronForSequenceClassification(X.NemotronConfig(head_dim=16, **dec)),
        "mpt": lambda: X.MptForSequenceClassification(X.MptConfig(
            d_model=32, n_heads=2, n_layers=2, expansion_ratio=2, max_seq_len=64, vocab_size=V, resid_pdrop=0.0,
            emb_pdrop=0.0, attn_config={"alibi": True, "attn_pdrop": 0}, initializer_range=0.2, num_labels=2,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)),
        "helium": lambda: X.HeliumForSequenceClassification(X.HeliumConfig(head_dim=16, **dec)),
        "glm": lambda: X.GlmForSequenceClassification(X.GlmConfig(head_dim=16, **dec)),
        "arcee": lambda: X.ArceeForSequenceClassification(X.ArceeConfig(head_dim=16, **dec)),
        "exaone4": lambda: X.Exaone4ForSequenceClassification(X.Exaone4Config(sliding_window=8, **dec)),
        "smollm3": lambda: X.SmolLM3ForSequenceClassification(X.SmolLM3Config(**dec)),
    }


def image_models():
    import transformers as X
    IMG = E.IMG
    vit = dict(image_size=IMG, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, num_labels=10, initializer_range=0.2)
    return {
        "resnet": lambda: X.ResNetForImageClassification(X.ResNetConfig(
            num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic",
            num_labels=10)),
        "convnextv2": lambda: X.ConvNextV2ForImageClassification(X.ConvNextV2Config(
            num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=IMG,
            drop_path_rate=0.0, num_labels=10, initializer_range=0.2)),
        "regnet": lambda: X.RegNetForImageClassification(X.RegNetConfig(
            num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8,
            layer_type="y", num_labels=10)),
        # width 0.05: stem 8 channels, head conv 1280*0.05 = 64 = hidden_dim
        "efficientnet": lambda: X.EfficientNetForImageClassification(X.EfficientNetConfig(
            num_channels=3, image_size=IMG, width_coefficient=0.05, depth_coefficient=1.0, kernel_sizes=[3, 5],
            in_channels=[32, 16], out_channels=[16, 24], depthwise_padding=[], strides=[1, 2],
            num_block_repeats=[1, 1], expand_ratios=[1, 6], hidden_dim=64, dropout_rate=0.0,
            drop_connect_rate=0.0, num_labels=10, initializer_range=0.2)),
        "mobilenet_v2": lambda: X.MobileNetV2ForImageClassification(X.MobileNetV2Config(
            num_channels=3, image_size=IMG, depth_multiplier=0.25, min_depth=8, classifier_dropout_prob=0.0,
            num_labels=10, initializer_range=0.2)),
        "mobilenet_v1": lambda: X.MobileNetV1ForImageClassification(X.MobileNetV1Config(
            num_channels=3, image_size=IMG, depth_multiplier=0.25, min_depth=8, classifier_dropout_prob=0.0,
            num_labels=10, initializer_range=0.2)),
        # ---- second batch
        # mobilevitv2 (MobileViTV2ForImageClassification) left out: at 32x32 its last stage gets a 1x1 map,
        # and unfolding that into 2x2 patches fails in PyTorch itself (RuntimeError from F.unfold)
        "swiftformer": lambda: X.SwiftFormerForImageClassification(X.SwiftFormerConfig(
            image_size=IMG, num_channels=3, depths=[1, 1], embed_dims=[16, 32], mlp_ratio=2, downsamples=[True, True],
            drop_path_rate=0.0, drop_mlp_rate=0.0, drop_conv_encoder_rate=0.0, num_labels=10)),
        "vit_msn": lambda: X.ViTMSNForImageClassification(X.ViTMSNConfig(**vit)),
        "ijepa": lambda: X.IJepaForImageClassification(X.IJepaConfig(**vit)),
        "dinov2_with_registers": lambda: X.Dinov2WithRegistersForImageClassification(X.Dinov2WithRegistersConfig(
            image_size=IMG, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, mlp_ratio=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            drop_path_rate=0.0, num_register_tokens=2, num_labels=10, initializer_range=0.2)),
    }


E.text_models = text_models
E.image_models = image_models

if __name__ == "__main__":
    E.main()
