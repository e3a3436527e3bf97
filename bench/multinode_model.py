#!/usr/bin/env python3
"""The inter-node model of docs/multi-node.md, fitted on bench/run_multinode.sh's raw output.

Reads the output (a file, or stdin) and prints, for each section with nodes (forced, namespaces):
the fit of latency per inter-node ring step (alpha) and the bandwidth of a node's link (B), the
model's check against the measured 2 x 2 Adam step, and its predictions for N nodes of 8 ranks.

Model (N nodes of L ranks, S bytes of f32 gradient, the same bytes of f32 weights):
  hierarchical all-reduce  T_ar(N, L, S)  = T_node(S) + 2 (N - 1) alpha + 2 (N - 1) / N * S / B
  fused Adam step          T_adam(N, L)   = A_node + U / (N L) + 2 (N - 1) alpha + 2 (N - 1) / N * S / B
  MPI_Allreduce + AdamW    T_base(N, L)   = 2 (N L - 1) alpha + 2 (N L - 1) / (N L) * S / B + U
with T_node the one-node all-reduce (Direct, over shared memory), A_node the one-node Adam step
less its update, U the AdamW loop over all N elements on one rank (the update's cost scales with
the slice a rank updates). Fit: T_hier(S) - T_direct(S) = 2 alpha + S / B at N = 2 (least
squares over the sizes measured, fastest repetitions, alpha >= 0).
"""
import re
import sys

MIB = 1 << 20


def parse(text):
    """Sections by their '## ' heading: all-reduce rows {method: {MiB: median s}}, Adam medians."""
    sections, name = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            # "forced nodes: ..." and a later "forced nodes, ..." are one section
            name = re.split(r"[:,]", line[3:])[0].strip()
            sections.setdefault(name, {"rows": {}, "adam": {}})
            continue
        if name is None:
            continue
        sec = sections[name]
        # "row METHOD RANKS MIB MEDIAN MIN MAX": the fit takes the fastest repetition, the one the
        # machine's other load disturbed least
        m = re.match(r"row (\S+) (\d+) (\d+) ([0-9.eE+-]+) ([0-9.eE+-]+)", line)
        if m:
            sec["rows"].setdefault(m.group(1), {})[int(m.group(3))] = float(m.group(5))
            continue
        m = re.match(r"median adam_f32_(\w+)_mpi_(baseline|tandem)_ms ([0-9.]+)", line)
        if m:
            sec["adam"]["size"] = m.group(1)
            sec["adam"][m.group(2)] = float(m.group(3)) / 1e3
            continue
        m = re.match(r"\s+AdamW loop alone\s+([0-9.]+) ms", line)
        if m:
            sec["adam"]["loop"] = float(m.group(1)) / 1e3
            continue
        m = re.match(r"\s+MPI_Allreduce alone\s+([0-9.]+) ms", line)
        if m:
            sec["adam"]["mpi_allreduce"] = float(m.group(1)) / 1e3
    return sections


def fit_line(xs, ys):
    """Least squares y = a + b x with a >= 0 (a latency is not negative: where the free fit's
    intercept is, the line goes through the origin instead and a is reported as 0)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    if a < 0:
        a, b = 0.0, sum(x * y for x, y in zip(xs, ys)) / sum(x * x for x in xs)
    return a, b


def main():
    text = open(sys.argv[1]).read() if len(sys.argv) > 1 else sys.stdin.read()
    sections = parse(text)
    one = next((s for k, s in sections.items() if k.startswith("one node")), None)
    if one is None or "tandem-mpi-direct" not in one["rows"] or "tandem" not in one["adam"]:
        sys.exit("multinode_model.py: error: no one-node section (Direct rows and an Adam step) in the input")
    direct = one["rows"]["tandem-mpi-direct"]
    size = one["adam"]["size"]
    n = int(size[:-2]) * (MIB if size.endswith("Mi") else 1)
    S = 4.0 * n
    L_here = 2
    U = one["adam"]["loop"]
    A_node = one["adam"]["tandem"] - U / L_here
    print(f"one node, {L_here} ranks: Adam {size} step {one['adam']['tandem'] * 1e3:.1f} ms, AdamW loop alone "
          f"{U * 1e3:.1f} ms, so A_node = {A_node * 1e3:.1f} ms")
    for name, sec in sections.items():
        hier = sec["rows"].get("tandem-mpi-hier")
        if not hier:
            continue
        sizes = sorted(set(hier) & set(direct))
        xs = [m * MIB for m in sizes]
        ys = [hier[m] - direct[m] for m in sizes]
        a, b = fit_line(xs, ys)
        alpha, B = a / 2, 1 / b
        print(f"\n{name}: fit over {', '.join(str(m) for m in sizes)} MiB of T_hier - T_direct = 2 alpha + S / B")
        print(f"  alpha = {alpha * 1e6:.0f} us per inter-node step, B = {B / 1e9:.3f} GB/s per node link")
        for m, x, y in zip(sizes, xs, ys):
            print(f"  {m:4d} MiB: measured {y * 1e3:8.2f} ms, fit {(a + b * x) * 1e3:8.2f} ms")
        adam = sec["adam"]
        if "tandem" not in adam:
            continue

        def t_adam(N, L, alpha=alpha, B=B):
            return A_node + U / (N * L) + 2 * (N - 1) * alpha + 2 * (N - 1) / N * S / B

        def t_base(N, L, alpha=alpha, B=B):
            p = N * L
            return 2 * (p - 1) * alpha + 2 * (p - 1) / p * S / B + U

        print(f"  Adam {size} at 2 x 2: measured {adam['tandem'] * 1e3:.1f} ms, model {t_adam(2, 2) * 1e3:.1f} ms; "
              f"MPI_Allreduce + AdamW measured {adam['baseline'] * 1e3:.1f} ms, model {t_base(2, 2) * 1e3:.1f} ms")
        for label, al, bw in ((f"fitted here (alpha {alpha * 1e6:.0f} us, B {B / 1e9:.2f} GB/s)", alpha, B),
                              ("assumed 100 Gb/s network (alpha 10 us, B 12.5 GB/s)", 10e-6, 12.5e9)):
            print(f"  predictions, 8 ranks a node, {label}:")
            print(f"    {'nodes':>6} {'ranks':>6} {'inter-node ms':>14} {'tandem ms':>10} {'baseline ms':>12} {'speedup':>8}")
            for N in (2, 8, 64, 512):
                inter = 2 * (N - 1) * al + 2 * (N - 1) / N * S / bw
                t, base = t_adam(N, 8, al, bw), t_base(N, 8, al, bw)
                print(f"    {N:6d} {N * 8:6d} {inter * 1e3:14.1f} {t * 1e3:10.1f} {base * 1e3:12.1f} {base / t:7.2f}x")


if __name__ == "__main__":
    main()
