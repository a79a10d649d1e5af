#!/usr/bin/env python3
"""Hands `tessera export --json` of every library scenario to megatron-core itself.

Usage: check-megatron-export.py <tessera binary> <scenario.json>...

For each scenario the export's values must build megatron-core's TransformerConfig (or
MLATransformerConfig), whose __post_init__ runs Megatron's own checks of the model shape, the
parallel layout, MoE, recomputation, pipeline layout and precision; its DistributedDataParallelConfig;
GPTModel's constructor must take the model keywords; the global batch must divide into micro
batches over the data-parallel replicas. Every exported flag must be a field of those configs
(Megatron-LM derives those flags from them) or one of the training arguments listed below, which
exist only in Megatron-LM (megatron/training/arguments.py, or generated there from its
training config dataclasses) and were checked against it by hand.
A scenario the export refuses (exit 2) must say why. Exit 1 on any failure.
"""
import dataclasses
import inspect
import json
import subprocess
import sys
import warnings

warnings.filterwarnings("ignore")

import megatron.core.utils  # noqa: E402
import torch  # noqa: E402
from packaging.version import Version  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from megatron.core.distributed import DistributedDataParallelConfig  # noqa: E402
from megatron.core.models.gpt import GPTModel  # noqa: E402
from megatron.core.transformer.enums import AttnBackend  # noqa: E402
from megatron.core.transformer.transformer_config import (  # noqa: E402
    MLATransformerConfig,
    TransformerConfig,
)

# Flags of Megatron-LM's training script that are not megatron-core config fields by their own
# name, as megatron/training/arguments.py defines them or generates them from
# megatron/training/config/*.py and argparse names in transformer_config.py (--fp8-format,
# --disable-bias-linear), checked by hand in NVIDIA/Megatron-LM at d98e8a64dd.
TRAINING_ARGUMENTS = {
    "--swiglu", "--disable-bias-linear", "--add-qkv-bias", "--group-query-attention",
    "--position-embedding-type", "--max-position-embeddings", "--tokenizer-type", "--vocab-size",
    "--make-vocab-size-divisible-by", "--untie-embeddings-and-output-weights", "--num-experts",
    "--num-virtual-stages-per-pipeline-rank", "--seq-length", "--micro-batch-size",
    "--global-batch-size", "--use-distributed-optimizer", "--ddp-bucket-size",
    "--grad-reduce-in-bf16", "--use-megatron-fsdp", "--fp8-param-gather", "--fp8-format",
    "--bf16", "--fp16", "--overlap-grad-reduce", "--overlap-param-gather",
    "--data-parallel-sharding-strategy",
}
# Transformer Engine builds only against CUDA and is not installed here; Megatron's checks that
# gate on its version see the release NVIDIA's PyTorch containers ship.
megatron.core.utils.get_te_version = lambda: Version("2.8.0")
# Nor its fused token permutation, which megatron-core imports from it when a config asks for it
# (moe_permute_fusion): stand-ins that only say the kernels exist, as they do where TE does.
import megatron.core.transformer.moe.moe_utils as moe_utils  # noqa: E402

for _name in ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
              "fused_sort_chunks_by_index_with_probs", "fused_unpermute"):
    if getattr(moe_utils, _name, None) is None:
        setattr(moe_utils, _name, lambda *args, **kwargs: None)

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def config_fields(cls):
    return {f.name for f in dataclasses.fields(cls)}


FIELDS = config_fields(MLATransformerConfig) | config_fields(DistributedDataParallelConfig)


def check(export):
    tc = dict(export["transformer_config"])
    cls = MLATransformerConfig if tc.pop("multi_latent_attention", False) else TransformerConfig
    if tc.pop("activation", None) == "silu":
        tc["activation_func"] = F.silu
    for key in ("params_dtype", "pipeline_dtype"):
        if key in tc:
            tc[key] = DTYPES[tc[key]]
    if "attention_backend" in tc:
        tc["attention_backend"] = AttnBackend[tc["attention_backend"]]
    cls(**tc)
    DistributedDataParallelConfig(**export["ddp_config"])
    parameters = inspect.signature(GPTModel.__init__).parameters
    for key in export["model"]:
        if key not in parameters:
            raise ValueError(f"GPTModel takes no {key}")
    if export["model"]["position_embedding_type"] not in ("learned_absolute", "rope"):
        raise ValueError("position_embedding_type " + export["model"]["position_embedding_type"])
    b = export["batch"]
    if b["global_batch_size"] % (b["micro_batch_size"] * b["data_parallel_size"]):
        raise ValueError(f"global batch {b['global_batch_size']} is not a multiple of micro "
                         f"batch {b['micro_batch_size']} x data-parallel {b['data_parallel_size']}")
    for flag in (a[0] for a in export["arguments"]):
        if flag not in TRAINING_ARGUMENTS and flag[2:].replace("-", "_") not in FIELDS:
            raise ValueError(f"{flag} is neither a megatron-core config field nor a listed "
                             "training argument")


def main():
    tessera, scenarios = sys.argv[1], sys.argv[2:]
    accepted, refused, failed = 0, 0, []
    for scenario in scenarios:
        run = subprocess.run([tessera, "export", "--json", scenario], capture_output=True,
                             text=True)
        if run.returncode == 2:
            if not run.stderr.strip():
                failed.append(f"{scenario}: refused without saying why")
            else:
                refused += 1
                print(f"refused  {scenario}: {run.stderr.strip().splitlines()[-1]}")
            continue
        if run.returncode != 0:
            failed.append(f"{scenario}: exit {run.returncode}: {run.stderr.strip()}")
            continue
        try:
            check(json.loads(run.stdout))
            accepted += 1
        except Exception as e:  # Megatron's own checks raise assorted types
            failed.append(f"{scenario}: {type(e).__name__}: {e}")
    for f in failed:
        print("FAILED  ", f)
    print(f"megatron-core accepted {accepted} exports, {refused} refused with a reason, "
          f"{len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
