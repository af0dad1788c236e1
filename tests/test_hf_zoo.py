"""More Hugging Face architectures, tiny and randomly initialised from their configs, exported with
torch.onnx (TorchScript, opset 17) and checked against onnxruntime on OpenCL. They bring patterns
the core models do not: T5's relative position buckets, Swin's window partitions, ConvNeXt's
channels-last LayerNorm, RoBERTa's CumSum position ids, Llama's RMSNorm, rotary embeddings and grouped-query attention,
RWKV's unrolled recurrence, Longformer's sliding-window attention with its global-attention indices
and ViT-MAE's random masking."""
from __future__ import annotations

import os
import tempfile
import warnings

import numpy as np
import pytest

import dlcc
from dlcc.verify import verify_outputs

from conftest import MODEL_DIR

IDS = (1, 16)
PIX = (1, 3, 32, 32)


def _configs():
    import transformers as T

    return {
        "distilbert": (T.DistilBertConfig, T.DistilBertModel, "input_ids", IDS,
                       dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128, vocab_size=1000, max_position_embeddings=64)),
        "roberta": (T.RobertaConfig, T.RobertaModel, "input_ids", IDS,
                    dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         vocab_size=1000, max_position_embeddings=64)),
        "t5-encoder": (T.T5Config, T.T5EncoderModel, "input_ids", IDS,
                       dict(d_model=64, d_kv=16, num_layers=2, num_heads=4, d_ff=128, vocab_size=1000)),
        "convnext": (T.ConvNextConfig, T.ConvNextModel, "pixel_values", PIX,
                     dict(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], image_size=32)),
        "swin": (T.SwinConfig, T.SwinModel, "pixel_values", PIX,
                 dict(image_size=32, patch_size=2, embed_dim=16, depths=[1, 1], num_heads=[2, 4], window_size=4)),
        "deit": (T.DeiTConfig, T.DeiTModel, "pixel_values", PIX,
                 dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                      image_size=32, patch_size=8)),
        # RMSNorm, rotary embeddings, SiLU-gated MLP, grouped-query attention.
        "llama": (T.LlamaConfig, T.LlamaModel, "input_ids", IDS,
                  dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=1000, max_position_embeddings=64, use_cache=False)),
        # The time-mix recurrence unrolled over the sequence, each step reading the last one's
        # result several times: inlined into a GEMM's loads, it expanded exponentially.
        "rwkv": (T.RwkvConfig, T.RwkvModel, "input_ids", IDS,
                 dict(hidden_size=64, num_hidden_layers=2, attention_hidden_size=64, intermediate_size=128,
                      vocab_size=1000, context_length=64, use_cache=False)),
        # Global-attention indices from NonZero of the all-ones mask it builds: constants that
        # onnxruntime's folding leaves for dlcc to fold.
        "longformer": (T.LongformerConfig, T.LongformerModel, "input_ids", IDS,
                       dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                            vocab_size=1000, max_position_embeddings=128, attention_window=[8, 8])),
        # Random masking: RandomUniformLike noise, argsorted (TopK), and the kept patches gathered
        # by it; verify hands onnxruntime dlcc's draws (docs/random.md).
        "vit-mae": (T.ViTMAEConfig, T.ViTMAEModel, "pixel_values", PIX,
                    dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                         image_size=32, patch_size=8)),
    }


NAMES = ["distilbert", "roberta", "t5-encoder", "convnext", "swin", "deit", "llama", "rwkv", "longformer", "vit-mae"]


def _export(name: str):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    path = MODEL_DIR / f"hf-{name}.onnx"
    if path.exists():
        return path
    cfg_cls, model_cls, input_name, shape, kw = _configs()[name]
    torch.manual_seed(0)
    cfg = cfg_cls(**kw)
    cfg._attn_implementation = "eager"
    model = model_cls(cfg).eval()
    with torch.no_grad():  # transformers zero-initialises biases; perturb them so a dropped bias shows
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            if name == "llama":  # without a mask, transformers calls torch.diff, which TorchScript cannot export
                return self.m(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state
            return self.m(x).last_hidden_state

    x = torch.randint(0, 100, shape) if input_name == "input_ids" else torch.randn(shape)
    MODEL_DIR.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".onnx", dir=MODEL_DIR)
    os.close(fd)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Wrap(model), (x,), tmp, input_names=[input_name], output_names=["last_hidden_state"],
                          dynamo=False, opset_version=17)
    os.replace(tmp, path)
    return path


#: `astitch` and `full` (AStitch's kernels joined by Rammer) by default; `baseline` and `rammer`
#: (Rammer over the unstitched kernels) add little the core models do not cover, and take as long
#: again on PoCL: they run under `-m slow`.
_PIPELINES = ["astitch", "full", pytest.param("baseline", marks=pytest.mark.slow),
              pytest.param("rammer", marks=pytest.mark.slow)]


@pytest.mark.parametrize("pipeline", _PIPELINES)
@pytest.mark.parametrize("name", NAMES)
def test_hf_architecture_matches_onnxruntime(name, pipeline):
    path = _export(name)
    m = dlcc.compile(path, target="opencl", pipeline=pipeline)
    feeds = m.sample_inputs(seed=0)
    got = m(feeds)
    assert float(np.abs(got["last_hidden_state"]).max()) > 0  # a real signal, not an all-zero output
    rows = verify_outputs(path, got, feeds, 1e-3, 1e-4, compiled=m)
    assert all(r["passed"] for r in rows), rows
