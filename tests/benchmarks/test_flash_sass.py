"""flash_sass compiles a flash kernel for sm_90 on this CPU machine and reads the order of its matmuls."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, interpret: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run([sys.executable, "-m", "benchmarks.flash_sass", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("head_dim", "dv_after_dp"), [(64, False), (128, True)])
def test_the_dkdv_loop_issues_dv_where_the_kernel_says(tmp_path, head_dim, dv_after_dp):
    r = _run("--pin", "dkdv=64,64,4,2", "--head-dim", str(head_dim), "--tma", "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / f"dkdv_64_64_4_2_d{head_dim}_tma.json").read_text())
    assert report["registers"] > 0 and report["sass_ops"].get("HGMMA.64x64x16.F32.BF16", 0) > 0
    for loop in report["loops"]:  # the causal diagonal loop and the unmasked one
        dots = [op for op in loop if op.startswith("dot:")]
        assert dots[0] == "dot:st" and dots[-1] == "dot:dk", loop
        assert (dots.index("dot:dv") > dots.index("dot:dpt")) == dv_after_dp, loop
        # the score matmuls are each waited on at once; dV and dK stay in flight
        assert loop[loop.index("dot:st") + 1] == "wait:0" and loop[loop.index("dot:dpt") + 1] == "wait:0"
    for suffix in (".ttgir", ".ptx", ".sass"):
        assert (tmp_path / f"dkdv_64_64_4_2_d{head_dim}_tma{suffix}").stat().st_size > 0
    # the SASS loops: each step with exp2s also holds the step's matmuls; counts add up to the mix
    steps = [lp for lp in report["sass_loops"] if lp["ops"].get("MUFU.EX2")]
    assert steps and all(lp["instructions"] == sum(lp["ops"].values()) for lp in report["sass_loops"])
    assert all(any(op.startswith("HGMMA") for op in lp["ops"]) for lp in steps)


def test_sass_loops_are_cut_at_branches_back_to_a_label():
    from benchmarks.flash_sass import sass_loops

    sass = """
        /*0000*/   MOV R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/   FMUL R2, R2, R3 ;
.L_x_2:
        /*0020*/   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R5 ;
        /*0030*/   @!P0 BRA `(.L_x_2) ;
        /*0040*/   MUFU.EX2 R4, R2 ;
        /*0050*/   @P1 BRA `(.L_x_1) ;
        /*0060*/   BRA `(.L_x_3) ;
.L_x_3:
        /*0070*/   EXIT ;
"""
    assert sass_loops(sass) == [
        {"label": ".L_x_2", "instructions": 2, "ops": {"SYNCS.PHASECHK.TRANS64.TRYWAIT": 1, "BRA": 1}},
        {"label": ".L_x_1", "instructions": 5,
         "ops": {"FMUL": 1, "SYNCS.PHASECHK.TRANS64.TRYWAIT": 1, "BRA": 2, "MUFU.EX2": 1}}]


def test_bad_input_is_named_and_writes_nothing(tmp_path):
    r = _run("--pin", "dkdv=64,64,4,2", "--head-dim", "300", "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "--head-dim 300" in r.stderr
    r = _run("--pin", "softmax=64,64,4,2", "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "softmax=64,64,4,2" in r.stderr
    r = _run("--pin", "fwd=128,64,8,3", "--out", str(tmp_path / "c"), interpret=True)
    assert r.returncode == 2 and "unset TRITON_INTERPRET" in r.stderr
    assert not any((tmp_path / d).exists() for d in "abc")


@pytest.mark.parametrize(("overlap", "head_dim"), [(True, 128), (False, 64)])
def test_the_gluon_forward_keeps_p_v_in_flight_through_the_softmax(tmp_path, overlap, head_dim):
    cfg = "64,64,3,4" + ("" if overlap else ",plain")
    r = _run("--gluon", cfg, "--head-dim", str(head_dim), "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    name = f"gluon_fwd_64_64_3_4{'' if overlap else '_plain'}_d{head_dim}"
    report = json.loads((tmp_path / f"{name}.json").read_text())
    assert report["kernel"] == "gluon_fwd" and report["stack_bytes"] == 0  # no spills at this config
    (loop,) = report["loops"]
    if overlap:  # S(t) and P(t-1) V(t-1) issued, wait for S alone, the softmax, then wait for P V
        assert loop[:3] == ["dot:s_tok", "dot:o_tok", "wait:1"], loop
        assert loop.index("exp2") < loop.index("wait:0"), loop
    else:
        assert "wait:1" not in loop and loop[0] == "dot:s" and loop[-1] == "dot:acc", loop


def test_the_warp_specialised_forward_has_a_loop_per_consumer_and_a_producer_without_matmuls(tmp_path):
    r = _run("--gluon", "128,128,2,4,ws", "--head-dim", "128", "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "gluon_fwd_128_128_2_4_ws_d128.json").read_text())
    consumers = [loop for loop in report["loops"] if any(op.startswith("dot:") for op in loop)]
    others = [loop for loop in report["loops"] if not any(op.startswith("dot:") for op in loop)]
    # the producer's loop, and each consumer's release of the tiles past its rows (none of them a matmul)
    assert len(consumers) == 2 and len(others) == 3, report["loops"]
    assert report["stack_bytes"] == 0  # 240 registers a consumer hold its 64x128 S, P and O (at 232 it spilled)
    for loop in consumers:  # each consumer warpgroup keeps its own P V in flight through its softmax
        assert loop[:3] == ["dot:s_tok", "dot:o_tok", "wait:1"], loop


def test_three_consumers_at_d64_each_keep_p_v_in_flight_and_do_not_spill_at_160_registers(tmp_path):
    r = _run("--gluon", "192,128,2,4,ws", "--head-dim", "64", "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "gluon_fwd_192_128_2_4_ws_d64.json").read_text())
    consumers = [loop for loop in report["loops"] if any(op.startswith("dot:") for op in loop)]
    assert len(consumers) == 3, report["loops"]
    assert report["stack_bytes"] == 0  # S (64 registers), P in 16 bits (32) and O (32) within 160
    for loop in consumers:
        assert loop[:3] == ["dot:s_tok", "dot:o_tok", "wait:1"], loop


def test_the_kv_mode_keeps_the_consumer_loops_and_adds_a_barrier_pair_a_slot(tmp_path):
    reports = {}
    for mode in ("ws", "ws-kv"):
        r = _run("--gluon", f"128,128,2,4,{mode}", "--head-dim", "128", "--out", str(tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        reports[mode] = json.loads((tmp_path / f"gluon_fwd_128_128_2_4_{mode}_d128.json").read_text())
    assert reports["ws-kv"]["loops"][:2] == reports["ws"]["loops"][:2]  # the two consumers' overlapped steps
    assert reports["ws-kv"]["stack_bytes"] == 0
    # V's ready and empty mbarriers (8 B each) for each of the 2 slots, beside K's
    assert reports["ws-kv"]["shared_bytes"] - reports["ws"]["shared_bytes"] == 2 * 2 * 8


def test_a_gluon_config_the_kernel_cannot_run_is_named(tmp_path):
    r = _run("--gluon", "64,128,3,4", "--head-dim", "128", "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "block_n 128" in r.stderr
    r = _run("--gluon", "64,64,3,4", "--head-dim", "96", "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "head dim 64 or 128" in r.stderr
    r = _run("--gluon", "64,64,3,4", "--pin", "fwd=128,64,8,3", "--out", str(tmp_path / "c"))
    assert r.returncode == 2 and "not allowed with" in r.stderr
    r = _run("--gluon", "128,128,2,8,ws", "--head-dim", "128", "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and "consumer warpgroups" in r.stderr
    assert not any((tmp_path / d).exists() for d in "abcd")


@pytest.mark.parametrize(("order", "head_dim"), [("overlap", 128), ("defer", 64), ("plain", 64)])
def test_the_gluon_dkdv_kernel_computes_under_its_matmuls_in_the_order_it_names(tmp_path, order, head_dim):
    stages = 3 if order == "defer" else 2
    cfg = f"64,64,{stages},4" + ("" if order == "overlap" else f",{order}")
    r = _run("--gluon-bwd", f"dkdv={cfg}", "--head-dim", str(head_dim), "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    name = f"gluon_dkdv_64x64x{stages}x4{'' if order == 'overlap' else '_' + order}_d{head_dim}"
    report = json.loads((tmp_path / f"{name}.json").read_text())
    assert report["kernel"] == "gluon_dkdv" and report["sass_ops"].get("HGMMA.64x64x16.F32.BF16", 0) > 0
    assert len(report["loops"]) == 2  # the causal diagonal tiles, then the unmasked ones
    for loop in report["loops"]:
        if order == "overlap":  # S^T and dP^T issued, wait for S^T alone, P^T while dP^T runs, dS^T while dV runs
            assert loop == ["dot:st_tok", "dot:dpt_tok", "wait:1", "exp2", "dot:dv_tok", "wait:1", "dot:dk_tok",
                            "wait:0"], loop
        elif order == "defer":  # the tile before's dK matmul issued behind this tile's scores
            assert loop[:4] == ["dot:st_tok", "dot:dpt_tok", "dot:dk_tok", "wait:2"], loop
            assert loop.index("exp2") < loop.index("wait:0"), loop
        else:
            assert loop == ["dot:st", "exp2", "dot:dv", "dot:dpt", "dot:dk"], loop


@pytest.mark.parametrize(("kernel", "cfg", "head_dim"), [("dkdv", "32,64,3,4", 64), ("dkdv", "32,64,3,4", 128),
                                                     ("dq", "64,64,2,4", 64)])
def test_the_rs_orders_give_the_score_matmuls_their_a_operands_from_registers(tmp_path, kernel, cfg, head_dim):
    # an HGMMA names its A operand as a register (RS) or as a shared-memory descriptor (SS, "gdesc").
    # The score matmuls (dK/dV: S^T = K Q^T, dP^T = V dO^T; dQ: S = Q K^T, dP = dO V^T) are SS in the
    # overlap order and RS in "overlap-rs"; the accumulating ones take P^T, dS^T or dS from registers in
    # both. The loops keep their matmuls and waits.
    a_operands, loops = {}, {}
    for order in ("overlap", "overlap-rs"):
        out = tmp_path / order
        r = _run("--gluon-bwd", f"{kernel}={cfg},{order}", "--head-dim", str(head_dim), "--causal", "--out", str(out))
        assert r.returncode == 0, r.stderr[-3000:]
        name = f"gluon_{kernel}_{cfg.replace(',', 'x')}{'' if order == 'overlap' else '_' + order}_d{head_dim}"
        loops[order] = json.loads((out / f"{name}.json").read_text())["loops"]
        hgmma = re.findall(r"HGMMA\.\S+ R\d+, (R\d+|gdesc)", (out / f"{name}.sass").read_text())
        a_operands[order] = Counter("smem" if a == "gdesc" else "registers" for a in hgmma)
    assert loops["overlap"] == loops["overlap-rs"] and loops["overlap"]
    assert a_operands["overlap"]["smem"] > 0 and a_operands["overlap"]["registers"] > 0
    assert a_operands["overlap-rs"]["smem"] == 0
    assert a_operands["overlap-rs"]["registers"] == sum(a_operands["overlap"].values())


@pytest.mark.parametrize(("cfg", "mode"), [("64,64,3,4", "overlap"), ("128,64,3,4", "ws")])
def test_the_forwards_rs_modes_give_the_score_matmul_q_from_registers(tmp_path, cfg, mode):
    # the forward's S = Q K^T is SS in its mode and RS with "-rs" (Q loaded once, before the loop); O += P V
    # takes P from registers in both. The loops keep their matmuls and waits, and nothing spills.
    a_operands, reports = {}, {}
    for m in (mode, mode + "-rs"):
        out = tmp_path / m
        r = _run("--gluon", f"{cfg},{m}", "--head-dim", "128", "--causal", "--out", str(out))
        assert r.returncode == 0, r.stderr[-3000:]
        (report_path,) = out.glob("*.json")
        reports[m] = json.loads(report_path.read_text())
        hgmma = re.findall(r"HGMMA\.\S+ R\d+, (R\d+|gdesc)", report_path.with_suffix(".sass").read_text())
        a_operands[m] = Counter("smem" if a == "gdesc" else "registers" for a in hgmma)
    rs = mode + "-rs"
    assert reports[mode]["loops"] == reports[rs]["loops"] and reports[mode]["loops"]
    assert a_operands[mode]["smem"] > 0 and a_operands[mode]["registers"] > 0
    assert a_operands[rs]["smem"] == 0 and a_operands[rs]["registers"] == sum(a_operands[mode].values())
    assert reports[rs]["stack_bytes"] == 0


def _registers_written_after_q_loads(sass: str) -> list[str]:
    """Instructions of a one-warpgroup kernel that write a register the Q tile was loaded into (LDSM)
    after that load: Q is read by every tile's score matmul, so none may."""
    lines = [line.strip() for line in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", line)]
    ldsm = re.compile(r"LDSM\.16\.M88\.4 R(\d+),")
    loads = [(i, int(m.group(1))) for i, line in enumerate(lines) if (m := ldsm.search(line))]
    q_regs = {base + k for _, base in loads for k in range(4)}
    written = []
    for line in lines[loads[0][0]:]:
        m = re.match(r"/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)\s+R(\d+)", line)
        if m and not m.group(1).startswith(("HGMMA", "LDSM", "ST")) and int(m.group(2)) in q_regs:
            written.append(line)
    return written


@pytest.mark.parametrize("head_dim", [64, 128])
def test_q_held_in_registers_is_never_overwritten_in_the_forward_loop(tmp_path, head_dim):
    # "plain-rs", left out of GLUON_MODES, compiled at d=64 to a P V matmul whose P was written into Q's
    # registers (wrong outputs on the GPU); the overlap order keeps Q's registers for Q alone
    r = _run("--gluon", "64,64,3,4,overlap-rs", "--head-dim", str(head_dim), "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    (sass,) = tmp_path.glob("*.sass")
    assert _registers_written_after_q_loads(sass.read_text()) == []


def test_the_q_register_check_sees_a_write_into_q():
    sass = """
        /*0010*/                   LDSM.16.M88.4 R100, [R3+UR8+0x8000] ;
        /*0020*/                   HGMMA.64x64x16.F32.BF16 R24, R100, gdesc[UR8], RZ, !UPT ;
        /*0030*/                   F2FP.BF16.F32.PACK_AB R102, R19, R20 ;
        /*0040*/                   FADD R27, R100, R19 ;
"""
    assert [line.split()[1] for line in _registers_written_after_q_loads(sass)] == ["F2FP.BF16.F32.PACK_AB"]


def test_the_warp_specialised_dkdv_kernel_runs_the_overlapped_step_in_each_consumer(tmp_path):
    r = _run("--gluon-bwd", "dkdv=64,128,2,4,ws", "--head-dim", "64", "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "gluon_dkdv_64x128x2x4_ws_d64.json").read_text())
    consumers = [loop for loop in report["loops"] if any(op.startswith("dot:") for op in loop)]
    # each of two consumers: its diagonal tiles, then the unmasked ones, S^T and dP^T in flight together
    assert len(consumers) == 4, report["loops"]
    for loop in consumers:
        assert loop == ["dot:st_tok", "dot:dpt_tok", "wait:1", "exp2", "dot:dv_tok", "wait:1", "dot:dk_tok",
                        "wait:0"], loop
    # the rest have no matmul: each consumer's walk past the tiles above its diagonal, and the producer
    assert len(report["loops"]) - len(consumers) == 3, report["loops"]


def test_the_warp_specialised_fused_kernel_adds_dq_in_each_consumer(tmp_path):
    r = _run("--gluon-bwd", "fused=64,128,2,4,ws", "--head-dim", "64", "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "gluon_fused_64x128x2x4_ws_d64.json").read_text())
    consumers = [loop for loop in report["loops"] if any(op.startswith("dot:") for op in loop)]
    assert len(consumers) == 4, report["loops"]  # two consumers, each its diagonal tiles then the rest
    for loop in consumers:  # the overlapped step, dQ's matmul issued beside dK's
        assert loop == ["dot:st_tok", "dot:dpt_tok", "wait:1", "exp2", "dot:dv_tok", "wait:1", "dot:dk_tok",
                        "dot:dq_tok", "wait:0"], loop
    assert report["stack_bytes"] == 0  # at d=64 the consumers' registers hold dQ's tile too
    adds = ("ATOMG.E.ADD", "REDG.E.ADD", "RED.E.ADD")
    assert any(op.startswith(adds) and ".F32" in op for op in report["sass_ops"]), report["sass_ops"]
    # the barrier before each consumer's dQ matmul is its own warpgroup's (a named barrier of 128 threads),
    # not the block's, which the producer warp never reaches
    ptx = (tmp_path / "gluon_fused_64x128x2x4_ws_d64.ptx").read_text()
    assert re.search(r"bar\.sync\s+[1-9]\d*, 128;", ptx)


def _copy_engine_adds(tmp_path, dq_mode: str, cfg: str = "64,128,2,4,ws", causal: bool = True,
                      rotate: bool = False) -> tuple[list[list[str]], str]:
    """Compile the warp-specialised fused kernel (d=64, causal unless said, rotated if asked) at `cfg` with
    dQ added by the copy engine in `dq_mode`, check what all such modes share, and return its consumers'
    loops and its PTX: the copy engine's reduction (UTMAREDG ... ADD), no thread adding an element itself,
    no stack, and a read-wait before a consumer rewrites its staging tile."""
    r = _run("--gluon-bwd", f"fused={cfg}", "--dq-mode", dq_mode, "--head-dim", "64", *(["--causal"] * causal),
             *(["--rotate"] * rotate), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    name = f"gluon_fused_{'x'.join(cfg.split(',')[:4])}_ws_{dq_mode}{'_rot' * rotate}_d64"
    report = json.loads((tmp_path / f"{name}.json").read_text())
    consumers = [loop for loop in report["loops"] if any(op.startswith("dot:") for op in loop)]
    ops = report["sass_ops"]
    assert any(op.startswith("UTMAREDG") and ".ADD" in op for op in ops), ops
    assert not any(op.startswith(("ATOMG.E.ADD", "REDG.E.ADD", "RED.E.ADD")) for op in ops), ops
    assert report["stack_bytes"] == 0
    ptx = (tmp_path / f"{name}.ptx").read_text()
    assert "cp.async.bulk.wait_group.read" in ptx
    return consumers, ptx


def test_the_copy_engines_dq_adds_replace_every_threads_atomics(tmp_path):
    # dq_mode "tma": each consumer stages its dQ tile in shared memory and one thread has the copy engine add
    # it (UTMAREDG), in the same loop; no thread adds an element itself
    consumers, _ = _copy_engine_adds(tmp_path, "tma")
    assert len(consumers) == 4 and all(loop[-2:] == ["dot:dq_tok", "wait:0"] for loop in consumers), consumers


def test_in_turns_one_consumer_a_tile_adds_the_dq_of_both_consumers_keys(tmp_path):
    # dq_mode "turns": on its tiles a consumer takes dS K over both consumers' keys (two matmuls into one
    # accumulator, in a branch the other consumer skips) and has the copy engine add it; the dS^T tiles are
    # shared through mbarriers, one arrive by one thread of each consumer
    consumers, ptx = _copy_engine_adds(tmp_path, "turns")
    assert len(consumers) == 4, consumers
    for loop in consumers:
        turn = loop[loop.index("dot:dk_tok") + 1:]
        assert turn[:3] == ["if", "dot:dq_tok", "dot:dq_tok"], loop
    assert re.search(r"@%p\d+ mbarrier\.arrive\.shared::cta\.b64", ptx)  # predicated: one thread arrives


def test_in_halves_every_consumer_adds_its_columns_of_every_tiles_dq(tmp_path):
    # dq_mode "halves": on every tile each consumer takes dS K over both consumers' keys for its half of the
    # columns (two (64, 32) matmuls at d=64, no branch on whose turn it is) and has the copy engine add it,
    # once its dV matmul is done (wait:1, which frees P^T's registers for dQ's accumulator); the tiles above a
    # consumer's diagonal still carry its columns of the other consumer's share
    consumers, _ = _copy_engine_adds(tmp_path, "halves", "64,128,3,4,ws")
    steps = [loop for loop in consumers if "dot:st_tok" in loop]
    skips = [loop for loop in consumers if "dot:st_tok" not in loop]
    assert len(steps) == 4 and len(skips) == 2, consumers
    for loop in steps:
        assert loop[loop.index("dot:dk_tok") + 1:] == ["wait:1", "dot:dq_tok", "dot:dq_tok", "wait:0"], loop
    for loop in skips:
        assert loop == ["dot:dq_tok", "dot:dq_tok", "wait:0"], loop
    report = json.loads((tmp_path / "gluon_fused_64x128x3x4_ws_halves_d64.json").read_text())
    assert any(op.startswith("HGMMA.64x32x16") for op in report["sass_ops"]), report["sass_ops"]


def test_halves_fit_the_fused_kernel_at_d128_in_less_shared_memory_than_turns(tmp_path):
    # at d=128 "turns" holds a (64, 128) fp32 dQ tile beside dK and dV, "halves" a (64, 64) one; both
    # compile (the warp-specialised budget), and halves stage half the tile
    reports = {}
    for mode in ("turns", "halves"):
        r = _run("--gluon-bwd", "fused=64,128,2,4,ws", "--dq-mode", mode, "--head-dim", "128", "--causal", "--out",
                 str(tmp_path / mode))
        assert r.returncode == 0, r.stderr[-3000:]
        reports[mode] = json.loads((tmp_path / mode / f"gluon_fused_64x128x2x4_ws_{mode}_d128.json").read_text())
    assert reports["halves"]["shared_bytes"] < reports["turns"]["shared_bytes"], reports


def _serialised_wgmmas(sass: list[str]) -> tuple[int, int]:
    """(HGMMAs, those waited for in full, WARPGROUP.DEPBAR.LE gsb0 0x0, before the next wgmma instruction):
    where ptxas lacks registers for the wgmma pipeline it waits on every one (its C7512)."""
    ops = [op for op in sass if op.startswith(("HGMMA", "WARPGROUP.DEPBAR.LE gsb0"))]
    hgmma = [i for i, op in enumerate(ops) if op.startswith("HGMMA")]
    waited = sum(1 for i in hgmma if i + 1 < len(ops) and ops[i + 1].startswith("WARPGROUP.DEPBAR.LE gsb0, 0x0"))
    return len(hgmma), waited


@pytest.mark.parametrize(("head_dim", "dq_mode", "causal"), [(64, "turns", True), (128, "halves", True),
                                                             (128, "halves", False)])
def test_the_shipped_fused_kernels_keep_their_wgmmas_in_flight(tmp_path, head_dim, dq_mode, causal):
    # the shipped fused backward's consumers issue a matmul's k-steps back to back and wait a few times a
    # tile (a tile's loop has 24 HGMMAs at d=64 and 32 at d=128); at d=128 with 232 registers a consumer ptxas
    # had serialised all 136 of the kernel's, waiting for each before the next
    r = _run("--gluon-bwd", "fused=64,128,3,4,ws", "--dq-mode", dq_mode, "--head-dim", str(head_dim),
             *(["--causal"] * causal), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    total, waited = _serialised_wgmmas(_sass_text(tmp_path / f"gluon_fused_64x128x3x4_ws_{dq_mode}_d{head_dim}.sass"))
    assert total >= 48 and waited <= total // 8, (total, waited)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_spread_dq_cast_moves_whole_rows_and_puts_columns_back_in_registers(tmp_path, head_dim):
    # cast_dq for the staged modes: 16-byte loads of the fp32 accumulator and 16-byte stores of dQ, the
    # columns put back by warp shuffles, with no shared memory and no stack (torch.mul of the permuted view
    # ran 1.8x the plain cast's time on an H100)
    r = _run("--cast-dq", "--head-dim", str(head_dim), "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / f"cast_dq_spread_d{head_dim}_bf16.json").read_text())
    ops = report["sass_ops"]
    elems = 64 * head_dim // 128  # a thread's share of a 64-row block
    assert ops.get("LDG.E.128", 0) == elems // 4 and ops.get("STG.E.128", 0) == elems // 8, ops
    assert all(op.endswith(".128") for op in ops if op.startswith(("LDG", "STG"))), ops
    assert not any(op.startswith(("STS", "LDS")) for op in ops), ops
    assert report["stack_bytes"] == 0 and report["shared_bytes"] == 0, report


def test_the_spread_dq_cast_wants_whole_groups_of_32_columns(tmp_path):
    r = _run("--cast-dq", "--head-dim", "48", "--out", str(tmp_path))
    assert r.returncode == 2 and "groups of 32" in r.stderr


def _sass_text(path) -> list[str]:
    """A SASS listing's instructions, without the addresses in their comments."""
    return [re.sub(r"/\*[0-9a-f]+\*/", "", line).strip() for line in path.read_text().splitlines()
            if re.match(r"\s*/\*[0-9a-f]+\*/", line)]


def test_rotated_query_tiles_take_a_remainder_and_compile_away_where_causal(tmp_path):
    # rotate: each non-causal program takes its query tiles from its own on, wrapping round, so the producer
    # and the consumers compute a tile's row with a remainder by the tile count (PTX rem, which the kernel
    # without it has none of) and the loops keep their form, with no stack; causal it is off, and the kernel
    # is the one without it
    consumers, ptx = _copy_engine_adds(tmp_path / "nc", "turns", "64,128,3,4,ws", causal=False, rotate=True)
    assert len(consumers) == 2 and all(loop[loop.index("dot:dk_tok") + 1:][:3] == ["if", "dot:dq_tok", "dot:dq_tok"]
                                       for loop in consumers), consumers
    assert len(re.findall(r"\brem\.[su]32\b", ptx)) >= 3  # the producer's and each consumer's
    _copy_engine_adds(tmp_path / "c", "turns", "64,128,3,4,ws", rotate=True)
    _copy_engine_adds(tmp_path / "c0", "turns", "64,128,3,4,ws")
    rotated = _sass_text(tmp_path / "c" / "gluon_fused_64x128x3x4_ws_turns_rot_d64.sass")
    assert rotated and rotated == _sass_text(tmp_path / "c0" / "gluon_fused_64x128x3x4_ws_turns_d64.sass")


def test_in_transposed_turns_three_consumers_take_32_query_tiles_without_spilling(tmp_path):
    # dq_mode "turns-t": dQ^T = K^T dS^T, so a 32-query tile is the matmul's N and three consumers (192 keys
    # a program) fit in their 160 registers; the consumer whose turn it is issues three matmuls, one for
    # each consumer's keys, into one accumulator
    consumers, _ = _copy_engine_adds(tmp_path, "turns-t", "32,192,3,4,ws", causal=False)
    assert len(consumers) == 3, consumers  # not causal: each consumer's one loop
    for loop in consumers:
        turn = loop[loop.index("dot:dk_tok") + 1:]
        assert turn[:4] == ["if", "dot:dq_tok", "dot:dq_tok", "dot:dq_tok"], loop


def test_the_gluon_dq_kernel_computes_p_while_dp_runs_and_bad_configs_are_named(tmp_path):
    r = _run("--gluon-bwd", "dq=64,64,2,4", "--head-dim", "64", "--causal", "--out", str(tmp_path / "ok"))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads((tmp_path / "ok" / "gluon_dq_64x64x2x4_d64.json").read_text())
    for loop in report["loops"]:
        assert loop == ["dot:s_tok", "dot:dp_tok", "wait:1", "exp2", "wait:0", "dot:dq"], loop
    r = _run("--gluon-bwd", "dq=64,64,3,4,defer", "--head-dim", "64", "--out", str(tmp_path / "a"))
    assert r.returncode == 2 and "order 'defer'" in r.stderr
    r = _run("--gluon-bwd", "dkdv=64,64,2,4", "--head-dim", "96", "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "head dim 64 or 128" in r.stderr
    r = _run("--gluon-bwd", "dv=64,64,2,4", "--out", str(tmp_path / "c"))
    assert r.returncode == 2 and "dkdv=CONFIG, dq=CONFIG or fused=CONFIG" in r.stderr
    r = _run("--gluon-bwd", "fused=32,64,2,4", "--head-dim", "64", "--out", str(tmp_path / "d"))
    assert r.returncode == 2 and "64 query rows" in r.stderr
    assert not any((tmp_path / d).exists() for d in "abcd")


@pytest.mark.parametrize("order", ["overlap", "defer"])
def test_the_fused_kernel_issues_dq_where_its_order_says_and_adds_it_in_fp32(tmp_path, order):
    cfg = "64,64,2,4" + ("" if order == "overlap" else ",defer")
    r = _run("--gluon-bwd", f"fused={cfg}", "--head-dim", "64", "--causal", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    name = "gluon_fused_64x64x2x4" + ("" if order == "overlap" else "_defer")
    report = json.loads((tmp_path / f"{name}_d64.json").read_text())
    for loop in report["loops"]:
        if order == "overlap":  # the dK/dV kernel's overlap order, with dQ's matmul issued beside dK's
            assert loop == ["dot:st_tok", "dot:dpt_tok", "wait:1", "exp2", "dot:dv_tok", "wait:1", "dot:dk_tok",
                            "dot:dq_tok", "wait:0"], loop
        else:  # the tile before's dQ matmul behind this tile's scores, in flight while P^T is computed
            assert loop[:5] == ["dot:st_tok", "dot:dpt_tok", "dot:dq_tok", "wait:2", "exp2"], loop
    adds = ("ATOMG.E.ADD", "REDG.E.ADD", "RED.E.ADD")
    atomics = {op: n for op, n in report["sass_ops"].items() if op.startswith(adds)}
    assert atomics and all(".F32" in op for op in atomics), atomics  # fp32 adds (F32 or F32x2), never bf16


def test_the_persistent_forward_runs_the_same_consumer_steps_inside_a_loop_over_query_tiles(tmp_path):
    reports = {}
    for mode in ("ws", "ws-p"):
        r = _run("--gluon", f"128,128,3,4,{mode}", "--head-dim", "128", "--out", str(tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        reports[mode] = json.loads((tmp_path / f"gluon_fwd_128_128_3_4_{mode}_d128.json").read_text())

    def steps(report):  # each consumer's overlapped steps: the loops that issue S(t) and P(t-1) V(t-1)
        return [loop for loop in report["loops"] if "dot:s_tok" in loop]
    assert len(steps(reports["ws"])) == 2 and steps(reports["ws-p"]) == steps(reports["ws"])
    # around them, each consumer's loop over its program's query tiles: the first tile's scores and the
    # last P V of each
    tiles = [loop for loop in reports["ws-p"]["loops"] if "dot:s" in loop and "dot:acc" in loop]
    assert len(tiles) == 2, reports["ws-p"]["loops"]


@pytest.mark.parametrize(("head_dim", "dq_mode", "causal"), [(128, "halves", False), (64, "turns", True)])
def test_the_persistent_fused_kernel_runs_the_same_consumer_steps_inside_a_loop_over_key_tiles(tmp_path, head_dim,
                                                                                               dq_mode, causal):
    # "ws-p" runs _dkdv_ws_tile on each key tile as "ws" does, so each consumer's steps compile to the same
    # matmuls and waits, still in flight; around them the loop over the program's key tiles. Its shared memory
    # (the one-tile kernel's and one barrier more) stays within the 227 KiB a block may have on sm_90
    reports, names = {}, {}
    for order in ("ws", "ws-p"):
        r = _run("--gluon-bwd", f"fused=64,128,3,4,{order}", "--dq-mode", dq_mode, "--head-dim", str(head_dim),
                 *(["--causal"] * causal), "--out", str(tmp_path))
        assert r.returncode == 0, r.stderr[-3000:]
        names[order] = tmp_path / f"gluon_fused_64x128x3x4_{order}_{dq_mode}_d{head_dim}"
        reports[order] = json.loads(names[order].with_suffix(".json").read_text())

    def steps(report):  # the consumers' step loops: the ones that issue S^T and dP^T
        return [loop for loop in report["loops"] if "dot:st_tok" in loop]
    assert len(steps(reports["ws"])) >= 2 and steps(reports["ws-p"]) == steps(reports["ws"])
    total, waited = _serialised_wgmmas(_sass_text(names["ws-p"].with_suffix(".sass")))
    assert total >= 48 and waited <= total // 8, (total, waited)
    assert reports["ws"]["shared_bytes"] < reports["ws-p"]["shared_bytes"] <= 227 * 1024
