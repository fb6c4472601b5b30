"""Fixture for leangrad's compact optimizer state (bf16 and block-wise 8-bit
Adam moments): torch.optim's own Adam/AdamW update on moments that are
round-tripped through the compact format after every step.

The 8-bit format is bitsandbytes' block-wise dynamic quantisation: blocks of
2048 values, each with its f32 absmax; a value's code is the nearest entry of
a 256-value map to value / absmax (the first map entry at or above the
midpoint search, as `torch.searchsorted` over the midpoints finds it). First
moments use the signed dynamic map, second moments the unsigned one
(`bitsandbytes.functional.create_dynamic_map(signed)`, rebuilt here with
torch exactly as bitsandbytes builds it; when bitsandbytes is installed the
two are compared). bf16 moments are `m.to(torch.bfloat16)`.

Per case: one f32 parameter of 4500 elements (three blocks, the last
partial), three steps with given gradients (the third block's gradient is
zero on the first step, so its moments' scale is 0 then), torch.optim with
foreach=False; after each step the parameter and the compact state.

Writes tests/fixtures/compact_state.safetensors:
- `map.signed`, `map.unsigned`: the two maps (f32, 256 each);
- `p0`, `grad.{s}` (s = 1..3): the initial parameter and the gradients;
- per case `{case}.p.{s}`, and per moment `{case}.{moment}.{s}` (u8 codes
  or bf16 values) and for 8-bit `{case}.{moment}_absmax.{s}` (f32);
- `quant.{signed,unsigned}.{x,codes,absmax}`: one vector's quantisation.

torch's Adam arithmetic on the CPU depends on the CPU (its AVX2/AVX-512
kernels fuse multiply-adds), so leangrad's updates agree with these to an
ulp, and a moment within an ulp of a midpoint between two codes may take
the neighbouring code; the quantisation itself agrees bit for bit.

    python3 python-compare/compact_state_fixture.py
"""
import os

import torch
from safetensors.torch import save_file

N = 4500
BLOCK = 2048
STEPS = 3


def linspace(start, end, steps):
    """torch.linspace as its AVX2/AVX-512 CPU kernels compute it: each
    entry one fused multiply-add (start + step·i, or end - step·(n-1-i)
    past the middle). Written out so that the fixture does not depend on
    the CPU it is generated on; checked against torch.linspace here."""
    f32 = torch.float32
    start_t, end_t = torch.tensor(start, dtype=f32), torch.tensor(end, dtype=f32)
    step = ((end_t - start_t) / (steps - 1)).double()
    out = []
    for i in range(steps):
        # One rounding: the f64 product and sum of these f32 values are
        # exact enough that rounding to f32 once equals the FMA.
        if i < steps // 2:
            out.append(start_t.double() + step * i)
        else:
            out.append(end_t.double() - step * (steps - i - 1))
    result = torch.stack(out).to(f32)
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        assert torch.equal(result, torch.linspace(start, end, steps)), "linspace differs"
    return result


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    """bitsandbytes' construction of its dynamic quantisation map."""
    data = []
    non_sign_bits = total_bits - (1 if signed else 1)
    additional_items = 2 ** (non_sign_bits - max_exponent_bits) - 1
    for i in range(max_exponent_bits):
        fraction_items = int(
            2 ** (i + non_sign_bits - max_exponent_bits) + 1
            if signed
            else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1
        )
        boundaries = linspace(0.1, 1, fraction_items)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    assert additional_items == 0
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


SIGNED = create_dynamic_map(True)
UNSIGNED = create_dynamic_map(False)


def check_against_bitsandbytes():
    try:
        import bitsandbytes.functional as F  # noqa: PLC0415
    except Exception as e:  # not installable everywhere (a CUDA package)
        print(f"bitsandbytes not available ({type(e).__name__}): maps not cross-checked")
        return
    for signed, ours in [(True, SIGNED), (False, UNSIGNED)]:
        theirs = F.create_dynamic_map(signed=signed).float()
        assert torch.equal(theirs, ours), f"signed={signed}: maps differ"
    print("maps equal bitsandbytes.functional.create_dynamic_map")
    # Codes: ours is the nearest map entry; bitsandbytes' CPU search picks
    # the neighbour on a few values within a hair of a midpoint. Check that
    # the absmax agrees exactly and that ours is never further away.
    g = torch.Generator().manual_seed(7)
    x = torch.randn(3 * BLOCK + 100, generator=g) * 0.3
    for qmap, y in [(SIGNED, x), (UNSIGNED, x.abs())]:
        codes, scales = quantize(y, qmap)
        theirs, qstate = F.quantize_blockwise(y, code=qmap, blocksize=BLOCK)
        theirs = theirs.flatten().long()
        assert torch.equal(qstate.absmax.float(), scales), "absmax differs"
        scale = scales.repeat_interleave(BLOCK)[: y.numel()]
        ours_err = (qmap[codes.long()] * scale - y).abs()
        their_err = (qmap[theirs] * scale - y).abs()
        assert bool((ours_err <= their_err).all()), "a code further than bitsandbytes'"
        gap = ((their_err - ours_err) / scale).max().item()
        differ = int((theirs != codes.long()).sum())
        print(f"codes: {differ} of {y.numel()} differ from bitsandbytes' (theirs at most "
              f"{gap:.1e} of absmax further away)")


def quantize(x, qmap):
    """Codes and per-block absmax of x (f32, 1-D)."""
    mids = (qmap[:-1] + qmap[1:]) * 0.5
    codes = torch.empty(x.numel(), dtype=torch.uint8)
    scales = []
    for b in range(0, x.numel(), BLOCK):
        blk = x[b:b + BLOCK]
        absmax = blk.abs().max()
        q = blk / absmax if absmax > 0 else torch.zeros_like(blk)
        codes[b:b + BLOCK] = torch.searchsorted(mids, q).to(torch.uint8)
        scales.append(absmax)
    return codes, torch.stack(scales).float()


def dequantize(codes, scales, qmap):
    out = torch.empty(codes.numel(), dtype=torch.float32)
    for k, b in enumerate(range(0, codes.numel(), BLOCK)):
        out[b:b + BLOCK] = qmap[codes[b:b + BLOCK].long()] * scales[k]
    return out


def inputs():
    g = torch.Generator().manual_seed(41)
    p0 = torch.randn(N, generator=g) * 0.5
    grads = []
    for s in range(1, STEPS + 1):
        gr = torch.randn(N, generator=g) * (0.1 * s)
        # A few large values so that absmax dominates a block.
        gr[17] = 3.0 * s
        if s == 1:
            gr[2 * BLOCK:] = 0.0
        grads.append(gr)
    return p0, grads


MOMENTS = ["exp_avg", "exp_avg_sq", "max_exp_avg_sq"]


def run(case, make_opt, fmt, p0, grads, out):
    p = torch.nn.Parameter(p0.clone())
    opt = make_opt([p])
    amsgrad = opt.param_groups[0]["amsgrad"]
    moments = MOMENTS[: 3 if amsgrad else 2]
    maps = {"exp_avg": SIGNED, "exp_avg_sq": UNSIGNED, "max_exp_avg_sq": UNSIGNED}
    stored = None  # the compact state between steps
    for s, gr in enumerate(grads, start=1):
        # Widen the stored state into torch's state.
        state = {"step": torch.tensor(float(s - 1))}
        for name in moments:
            if stored is None:
                state[name] = torch.zeros(N)
            elif fmt == "bf16":
                state[name] = stored[name].float()
            else:
                state[name] = dequantize(*stored[name], maps[name])
        opt.state[p] = state
        p.grad = gr.clone()
        opt.step()
        st = opt.state[p]
        stored = {}
        for name in moments:
            if fmt == "bf16":
                stored[name] = st[name].to(torch.bfloat16)
                out[f"{case}.{name}.{s}"] = stored[name]
            else:
                codes, scales = quantize(st[name], maps[name])
                stored[name] = (codes, scales)
                out[f"{case}.{name}.{s}"] = codes
                out[f"{case}.{name}_absmax.{s}"] = scales
        out[f"{case}.p.{s}"] = p.detach().clone()


def main():
    check_against_bitsandbytes()
    p0, grads = inputs()
    out = {"map.signed": SIGNED, "map.unsigned": UNSIGNED, "p0": p0}
    for s, gr in enumerate(grads, start=1):
        out[f"grad.{s}"] = gr
    cases = {
        "adamw_8bit": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01,
                                                    foreach=False), "8bit"),
        "adamw_bf16": (lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.01,
                                                    foreach=False), "bf16"),
        "adam_amsgrad_8bit": (lambda ps: torch.optim.Adam(ps, lr=1e-2, weight_decay=0.02,
                                                          amsgrad=True, foreach=False),
                              "8bit"),
    }
    # Quantisation alone, exact: a vector with a zero block, ties and NaN-free
    # extremes, through both maps.
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2 * BLOCK + 300, generator=g) * 0.2
    x[BLOCK:2 * BLOCK] = 0.0
    x[3] = -1.5  # a negative absmax: -1 is not in the signed map
    for name, qmap, y in [("signed", SIGNED, x), ("unsigned", UNSIGNED, x.abs())]:
        codes, scales = quantize(y, qmap)
        out[f"quant.{name}.x"] = y
        out[f"quant.{name}.codes"] = codes
        out[f"quant.{name}.absmax"] = scales
    for case, (make, fmt) in cases.items():
        run(case, make, fmt, p0, grads, out)
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "tests", "fixtures", "compact_state.safetensors")
    save_file({k: v.contiguous() for k, v in out.items()}, path)
    print(f"wrote {os.path.normpath(path)} ({len(out)} tensors)")


if __name__ == "__main__":
    main()
