"""The costed plan as the paper profile's dry run prints it: per artifact its runs (parameters, FLOPs,
activation memory per GPU, model state, GPU-hours, the data each needs and the command it would
execute) and the artifact's total, then the whole paper's (:mod:`reproduce.cost.paper_cost` makes the plan)."""
from __future__ import annotations

from reproduce.cost.paper_cost import H100_BF16, Cost, totals

GiB = 2**30


def _si(x: float | None, unit: str = "") -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"


def render(costs: list[Cost], mfu: float, out: str = "") -> str:
    """The plan as text: per artifact its runs (figures, command, data) and total; then the paper's total."""
    lines = [f"Cost of the plan at MFU {100 * mfu:g}% of an H100's {H100_BF16 / 1e12:.0f} TFLOP/s (dense bf16); "
             f"FLOPs: matrix products and attention, counted on the meta device (reproduce/cost/model_cost.py).",
             f"Activation memory: per GPU at the micro-batch, under bf16 autocast; model state = fp32 weights, "
             f"gradients, AdamW moments and bf16 weight copies (18 B/parameter)."]
    head = f"  {'run':46s} {'GPUs':>4s} {'params':>7s} {'FLOPs':>8s} {'act/GPU':>9s} {'state':>7s} {'GPU-h':>8s}"
    total = totals(costs, mfu)
    artifacts = sorted({a for c in costs if c.notebook != "figures" for a in c.artifacts},
                       key=lambda a: (a[:3] != "tab", a))
    for artifact in artifacts:
        mine = [c for c in costs if artifact in c.artifacts and c.notebook != "figures"]
        lines += ["", f"== {artifact}: {len(mine)} runs, {total[artifact]:,.0f} GPU-hours", head]
        for c in mine:
            act = f"{c.act_bytes / GiB:.1f}GiB" if c.act_bytes is not None else "-"
            state = f"{c.state_bytes / GiB:.1f}GiB" if c.state_bytes is not None else "-"
            batch = f" @{c.micro_batch}" if c.micro_batch else ""
            lines.append(f"  {c.run:46s} {c.gpus:4d} {_si(c.params):>7s} {_si(c.flops):>8s} "
                         f"{act + batch:>9s} {state:>7s} {c.gpu_hours(mfu):8.1f}")
            data = ", ".join(f"{v} {'set' if ok else 'UNSET'}" for v, ok in c.data.items())
            lines.append(f"      data: {data or 'none'}" + (f"; {'; '.join(c.notes)}" if c.notes else ""))
            lines.append(f"      $ {c.command}")
    unset = sorted({v for c in costs for v, ok in c.data.items() if not ok})
    gpus = max((c.gpus for c in costs), default=8) or 8
    lines += ["", f"== total: {len(costs)} runs, {total['total']:,.0f} GPU-hours at MFU {100 * mfu:g}% "
                  f"(= {total['total'] / gpus / 24:,.1f} days on one node of {gpus} H100s); per artifact: "
                  + ", ".join(f"{a} {total[a]:,.0f}" for a in artifacts)]
    shared = [c for c in costs if c.notebook != "figures" and len(c.artifacts) > 1]
    if shared:
        lines.append(f"   {len(shared)} runs feed more than one artifact and count in each artifact's figure above, so "
                     f"those figures sum to {sum(total[a] for a in artifacts):,.0f} GPU-hours; the total counts "
                     f"each run once")
    if unset:
        lines.append(f"   data variables not set: {', '.join(unset)} (reproduce/registry.py: PAPER_ENV)")
    return "\n".join(lines)
