#!/usr/bin/env python3
"""Measured matrix-product rates on this machine's GPU, for the cost model's GEMM constants.

Usage: scripts/gemm-rates.py [--device cuda|cpu] [--out FILE.jsonl] [--size N] [--quick]
(scripts/gpu-check.sh gemm runs it)
Times, with device events (medians of 5 batches of 10 calls after 3 warm-up calls, random data):
  dense    a bf16 N x N x N product, and FP8 (e4m3) products of the same shape under each scaling
           torch offers: one scale per tensor (with and without fast accumulation), per row and
           column, and per block (1x128 activations, 128x128 weights, as DeepSeek-V3 trains);
           each FP8 result checked against the bf16 product of the same quantized values
  grouped  a bf16 grouped product (torch._grouped_mm, one GEMM per local expert, as Megatron-LM's
           grouped GEMM runs a rank's routed experts) for 8 experts and 64 to 4,096 tokens each,
           at two experts' shapes (DeepSeek-V3's first expert GEMM, 7,168 x 4,096; Qwen3-235B's,
           4,096 x 3,072), beside one dense product of all the tokens; the same in FP8 with one
           scale per token and per expert column (torch._scaled_grouped_mm) beside one FP8 dense
           product; each checked against the experts' products one by one
  streams  the same bf16 experts as Transformer Engine's GroupedLinear runs them by default (no
           NVTE_USE_CUTLASS_GROUPED_GEMM, as in Megatron-LM's and NVIDIA's recipes): one cuBLAS
           product per expert, dealt in turn to 4 side streams that the current stream waits for
           (its multi-stream cuBLAS path), at the same shapes and Qwen3-30B-A3B's two expert GEMMs
           (2,048 x 1,536 gated and 768 x 2,048)
FILE holds a first JSON line naming the device and torch, then one line per measurement (kind,
dtype and FP8 scaling, the shape, seconds, TFLOP/s, the check's relative error), written as it is
taken; `tessera gemms FILE` sets them beside the cost model. A table on the terminal. On the CPU (--device cpu --quick) it is the
dry run that keeps the script working: small shapes, and what the CPU lacks reported as skipped."""
import argparse
import json
import statistics
import sys
import time

import torch


# Calls timed: warm-up calls, then batches of calls, each batch timed as one (--quick: one call).
REPEATS = {"warmup": 3, "batches": 5, "per_batch": 10}


def timed(device, fn):
    """Median seconds of one call of fn over the batches of REPEATS."""
    batches, per_batch = REPEATS["batches"], REPEATS["per_batch"]
    for _ in range(REPEATS["warmup"]):
        fn()
    times = []
    for _ in range(batches):
        if device == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per_batch):
                fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) * 1e-3 / per_batch)
        else:
            t = time.perf_counter()
            for _ in range(per_batch):
                fn()
            times.append((time.perf_counter() - t) / per_batch)
    return statistics.median(times)


def rel_error(out, ref):
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


class Recorder:
    def __init__(self, path, device):
        self.file = open(path, "w") if path else None
        if self.file:  # the first line: where it was measured
            self.file.write(json.dumps({"device": device, "torch": torch.__version__}) + "\n")
        print(f"{'kind':9s} {'what':44s} {'m':>6s} {'n':>6s} {'k':>6s} {'groups':>6s} "
              f"{'ms':>9s} {'TFLOP/s':>8s} {'rel.err':>8s}")

    def __call__(self, kind, what, m, n, k, groups, seconds, error=None, skipped=None):
        # dtype: the operands' (bf16, or fp8 under `scaling`: tensor, row or block)
        row = {"kind": kind, "what": what, "dtype": "fp8" if what.startswith("fp8") else "bf16",
               "m": m, "n": n, "k": k, "groups": groups}
        if what.startswith("fp8"):
            row["scaling"] = what.split()[2].rstrip(",")
        if skipped is not None:
            row["skipped"] = skipped
            print(f"{kind:9s} {what:44s} skipped: {skipped[:120]}")
        else:
            flops = 2.0 * m * n * k * groups
            row.update(seconds=seconds, tflops=flops / seconds / 1e12, rel_error=error)
            err = "" if error is None else f"{error:.1e}"
            print(f"{kind:9s} {what:44s} {m:6d} {n:6d} {k:6d} {groups:6d} "
                  f"{seconds * 1e3:9.4f} {row['tflops']:8.1f} {err:>8s}")
        if self.file:
            self.file.write(json.dumps(row) + "\n")
            self.file.flush()


def quantize(x, scale):
    """x / scale in e4m3, with scale broadcast over x (the FP8 value's decoding factor)."""
    return (x / scale).to(torch.float8_e4m3fn)


def dense(device, n, record):
    g = torch.Generator(device=device).manual_seed(1)
    a = torch.randn(n, n, device=device, generator=g, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, generator=g, dtype=torch.bfloat16)
    record("dense", "bf16", n, n, n, 1, timed(device, lambda: a @ b))

    bt = b.t().contiguous()  # FP8 products take B column-major: (n, k) rows, transposed
    af, bf = a.float(), bt.float()
    recipes = []
    # One scale per tensor, from the tensor's largest magnitude (e4m3's largest value is 448).
    sa, sb = af.abs().max() / 448, bf.abs().max() / 448
    recipes.append(("fp8 per tensor", quantize(af, sa), quantize(bf, sb), sa, sb, {}))
    recipes.append(("fp8 per tensor, fast accumulation", quantize(af, sa), quantize(bf, sb), sa,
                    sb, {"use_fast_accum": True}))
    # One scale per row of A and per column of B.
    ra, rb = af.abs().amax(1, keepdim=True) / 448, bf.abs().amax(1, keepdim=True) / 448
    recipes.append(("fp8 per row", quantize(af, ra), quantize(bf, rb), ra, rb.t().contiguous(), {}))
    # 1x128 blocks of A along k; 128x128 blocks of B. Scales laid out k-block major (their
    # transposes contiguous), as cuBLAS's block-scaled FP8 products take them.
    kb = n // 128
    blk_a = af.view(n, kb, 128).abs().amax(2) / 448  # (m, k/128)
    blk_b = bf.view(n // 128, 128, kb, 128).abs().amax((1, 3)) / 448  # (n/128, k/128)
    qa = quantize(af.view(n, kb, 128), blk_a[:, :, None]).view(n, n)
    qb = quantize(bf.view(n // 128, 128, kb, 128), blk_b[:, None, :, None]).view(n, n)
    recipes.append(("fp8 per block (1x128, 128x128)", qa, qb, blk_a.t().contiguous().t(),
                    blk_b.contiguous().t(), {}))
    for what, qa, qb, sa, sb, extra in recipes:
        try:
            fn = lambda: torch._scaled_mm(qa, qb.t(), sa, sb, out_dtype=torch.bfloat16, **extra)
            out = fn()
            ref = dequantized_product(qa, qb, sa, sb)
            record("dense", what, n, n, n, 1, timed(device, fn), rel_error(out, ref))
        except (RuntimeError, NotImplementedError, TypeError) as e:
            record("dense", what, n, n, n, 1, None, skipped=str(e).splitlines()[0])


def dequantized_product(qa, qb, sa, sb):
    """The product the scaled FP8 product should give: its operands decoded, multiplied in fp32."""
    a, b = qa.float(), qb.float()
    m, k = a.shape
    n = b.shape[0]
    if sa.numel() == 1:
        a, b = a * sa, b * sb
    elif sa.shape == (m, 1):
        a, b = a * sa, b * sb.t()
    else:  # per block: sa (m, k/128) seen through its transpose, sb (k/128, n/128) likewise
        a = (a.view(m, k // 128, 128) * sa[:, :, None]).view(m, k)
        sbt = sb.t()  # (n/128, k/128)
        b = (b.view(n // 128, 128, k // 128, 128) * sbt[:, None, :, None]).view(n, k)
    return a @ b.t()


def grouped(device, sizes, shapes, groups, record):
    g = torch.Generator(device=device).manual_seed(2)
    for k, n, label in shapes:
        # Each expert's weight (n, k) row-major, used transposed: B column-major, as the grouped
        # kernel wants it.
        w = torch.randn(groups, n, k, device=device, generator=g, dtype=torch.bfloat16) * k ** -0.5
        for m in sizes:
            x = torch.randn(groups * m, k, device=device, generator=g, dtype=torch.bfloat16)
            offs = torch.arange(1, groups + 1, device=device, dtype=torch.int32) * m
            what = f"{label}: {groups} experts, {m} tokens each"
            try:
                fn = lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
                out = fn()
                ref = torch.cat([x[i * m:(i + 1) * m].float() @ w[i].float().t()
                                 for i in range(groups)])
                record("grouped", what, m, n, k, groups, timed(device, fn), rel_error(out, ref))
            except (RuntimeError, NotImplementedError, TypeError) as e:
                record("grouped", what, m, n, k, groups, None, skipped=str(e).splitlines()[0])
            w0 = w[0].t()
            record("grouped", f"{label}: one dense product of {groups * m} tokens", groups * m, n,
                   k, 1, timed(device, lambda: x @ w0))
            multi_stream(device, x, w, m, label, record)
            grouped_fp8(device, x, w, offs, m, label, record)


# Transformer Engine's compute streams for the experts' products (multi_stream.cpp).
TE_STREAMS = 4


def multi_stream(device, x, w, m, label, record):
    """The experts' products as Transformer Engine's GroupedLinear launches them without its
    CUTLASS grouped path: expert i's cuBLAS product on side stream i mod 4, the side streams
    waiting for the current one first and the current one for all of them last. The CPU has no
    streams: there they run one after another (the dry run checks the products)."""
    groups = w.shape[0]
    xs = [x[i * m:(i + 1) * m] for i in range(groups)]
    wt = [w[i].t() for i in range(groups)]
    outs = [None] * groups
    if device == "cuda":
        streams = [torch.cuda.Stream() for _ in range(min(TE_STREAMS, groups))]

        def fn():
            current = torch.cuda.current_stream()
            for s in streams:
                s.wait_stream(current)
            for i in range(groups):
                with torch.cuda.stream(streams[i % len(streams)]):
                    outs[i] = xs[i] @ wt[i]
            for s in streams:
                current.wait_stream(s)
    else:
        def fn():
            for i in range(groups):
                outs[i] = xs[i] @ wt[i]
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    ref = torch.cat([xs[i].float() @ wt[i].float() for i in range(groups)])
    record("streams", f"{label}: {groups} experts on {TE_STREAMS} streams, {m} tokens each", m,
           w.shape[1], w.shape[2], groups, timed(device, fn), rel_error(torch.cat(outs), ref))


def grouped_fp8(device, x, w, offs, m, label, record):
    """The same experts in FP8 (e4m3) with one scale per token row and per expert output column,
    as FP8 expert GEMMs scale them (torch._scaled_grouped_mm), beside one FP8 product of all the
    tokens at the same scaling; checked against the experts' dequantized products one by one. The
    CPU has neither product: there its arguments are checked on meta tensors (shapes, strides,
    scales), which fails the dry run where they are wrong."""
    groups, n, k = w.shape
    xf, wf = x.float(), w.float()
    sx = xf.abs().amax(1) / 448  # (groups * m,)
    sw = wf.abs().amax(2) / 448  # (groups, n)
    qx = quantize(xf, sx[:, None])
    qw = quantize(wf, sw[:, :, None])  # (groups, n, k) row-major: column-major once transposed
    q0, s0 = qw[0], sw[0][None, :].contiguous()  # expert 0's, for the dense product
    products = [
        (f"fp8 per row, {label}: {groups} experts, {m} tokens each", groups,
         lambda t: torch._scaled_grouped_mm(t(qx), t(qw).transpose(-2, -1), t(sx), t(sw),
                                            offs=t(offs), out_dtype=torch.bfloat16),
         lambda: torch.cat([(qx[i * m:(i + 1) * m].float() * sx[i * m:(i + 1) * m, None]) @
                            (qw[i].float() * sw[i][:, None]).t() for i in range(groups)])),
        (f"fp8 per row, {label}: one dense product of {groups * m} tokens", 1,
         lambda t: torch._scaled_mm(t(qx), t(q0).t(), t(sx[:, None].contiguous()), t(s0),
                                    out_dtype=torch.bfloat16),
         lambda: (qx.float() * sx[:, None]) @ (q0.float() * sw[0][:, None]).t()),
    ]
    for what, g, product, reference in products:
        rows = m if g > 1 else groups * m
        if device == "cpu":
            out = product(lambda t: t.to("meta"))
            assert out.shape == (groups * m, n), f"{what}: product of shape {tuple(out.shape)}"
            assert reference().shape == (groups * m, n)
        try:
            fn = lambda: product(lambda t: t)
            out = fn()
            record("grouped", what, rows, n, k, g, timed(device, fn), rel_error(out, reference()))
        except (RuntimeError, NotImplementedError, TypeError) as e:
            record("grouped", what, rows, n, k, g, None, skipped=str(e).splitlines()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--quick", action="store_true",
                    help="small grouped shapes, each call timed once (the CPU dry run)")
    a = ap.parse_args()
    if a.quick:
        REPEATS.update(warmup=1, batches=1, per_batch=1)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("gemm-rates: no CUDA device", file=sys.stderr)
        return 1
    if a.size % 128:
        print("gemm-rates: --size must be a multiple of 128", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    print(f"device: {name}, torch {torch.__version__}")
    record = Recorder(a.out, name)
    dense(a.device, a.size, record)
    if a.quick:
        grouped(a.device, [16, 64], [(256, 128, "small")], 4, record)
    else:
        grouped(a.device, [64, 128, 256, 512, 1024, 2048, 4096],
                [(7168, 4096, "DeepSeek-V3 fc1"), (4096, 3072, "Qwen3-235B fc1"),
                 (2048, 1536, "Qwen3-30B-A3B fc1"), (768, 2048, "Qwen3-30B-A3B fc2")], 8, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
