"""The persistent kernels' tile schedule, modelled: how much work the busiest program gets against the mean.

    python -m benchmarks.tile_balance --out balance.json                      (the shapes below, 132 SMs)
    python -m benchmarks.tile_balance --shape 4,16,4096,128,causal --programs 132 --out balance.json
    python -m benchmarks.tile_balance --backward --out balance_bwd.json       (the fused backward's key tiles)

For each shape, the tiles and grid order flash_triton's shipped forward would launch (kernels/flash_gluon.py:
SHIPPED_FWD's rows a tile, 128-key tiles, flash_triton._head_group), each tile's work counted as its key tiles
plus TILE_FIXED_COST, and the busiest program's work over the mean for each way tile_schedule weighs:
each of flash_gluon.hand_outs (round-robin, earliest-free in launch order, earliest-free with the last
TAIL_WAVES waves heaviest first) and the one tile_schedule picks. With --backward, the fused backward's key
tiles instead (kernels/flash_gluon_bwd.py: FUSED_CONFIG_WS's 128 keys a tile, each tile's work its 64-query
steps, key_tile_costs), what its persistent order "ws-p" is handed; earliest-free in launch order is also how
the hardware hands the one-tile kernel's grid out. A model of the work, not a timing: no GPU needed.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

SHAPES = [(4, 16, 4096, 128, True), (2, 16, 8192, 128, True), (1, 16, 16384, 128, True),
          (4, 32, 4096, 64, True), (2, 32, 8192, 64, True), (1, 32, 16384, 64, True), (16, 1, 16384, 64, True),
          (8, 32, 512, 128, True), (4, 16, 4096, 128, False)]


def parse_shape(text: str) -> tuple[int, int, int, int, bool]:
    parts = text.split(",")
    if len(parts) not in (4, 5) or (len(parts) == 5 and parts[4] != "causal"):
        raise argparse.ArgumentTypeError(f"{text!r}: want B,H,S,D[,causal]")
    try:
        b, h, s, d = (int(p) for p in parts[:4])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: B, H, S and D are integers") from None
    if min(b, h, s, d) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: B, H, S and D are at least 1")
    return b, h, s, d, len(parts) == 5


def balance(shape: tuple[int, int, int, int, bool], programs: int, backward: bool = False) -> dict:
    from kernels import flash_gluon as fg
    from kernels import flash_triton as ft

    b, h, s, d, causal = shape
    group = ft._head_group(causal, b * h, None)
    if backward:
        from kernels import flash_gluon_bwd as gb

        cfg = gb.FUSED_CONFIG_WS
        costs = gb.key_tile_costs(b * h, s, s, cfg.block_m, cfg.block_n, group, causal)
    else:
        cfg = fg.shipped_config(d, causal) or fg.FWD_CONFIG_WS
        costs = fg.tile_costs(b * h, s, s, cfg.block_m, cfg.block_n, group, causal)
    used = min(programs, len(costs))
    mean = sum(c + fg.TILE_FIXED_COST for c in costs) / used
    ways = fg.hand_outs(costs, used)
    table = fg.tile_schedule(costs, programs)
    ways["tile_schedule"] = [table[used + 1 + table[p]:used + 1 + table[p + 1]] for p in range(used)]
    busiest = {name: round(fg._busiest(costs, tiles) / mean, 4) for name, tiles in ways.items()}
    return {"shape": list(shape[:4]), "causal": causal, "pass": "bwd" if backward else "fwd",
            "block_m": cfg.block_m, "block_n": cfg.block_n,
            "group": group, "tiles": len(costs), "programs": used, "busiest_over_mean": busiest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=parse_shape, action="append", metavar="B,H,S,D[,causal]",
                    help="a shape (repeatable; default: a causal grid at d 64 and 128, and one non-causal)")
    ap.add_argument("--programs", type=int, default=132, help="persistent programs: the GPU's SMs (H100, H200: 132)")
    ap.add_argument("--backward", action="store_true", help="the fused backward's key tiles, not the forward's")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--commit", default=None)
    args = ap.parse_args(argv)
    if args.programs < 1:
        ap.error(f"--programs {args.programs}: at least 1")
    from worker.harness import fingerprint

    rows = [balance(shape, args.programs, args.backward) for shape in args.shape or SHAPES]
    for row in rows:
        ratios = "  ".join(f"{k} {v:.3f}x" for k, v in row["busiest_over_mean"].items())
        print(f"{tuple(row['shape'])} {'causal' if row['causal'] else 'non-causal'}, {row['tiles']} tiles: {ratios}")
    args.out.write_text(json.dumps({"kind": "tile_balance", **fingerprint(args.commit), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
