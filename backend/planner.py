"""The parallelism planner: FLOPs, communication and memory per device of a Transformer training step
under DP, FSDP, TP and FSDP+TP, and where each becomes communication-bound. Torch-free; the
derivations are written out in docs/planner.md, whose symbols these names follow.

Model: L layers of attention (Q, K, V, O: 4 D^2 weights) and a SwiGLU FFN (W1, W3: D x F, W2: F x D),
an embedding and an untied LM head (V x D each). A step sees T = batch x S tokens.
Cluster: N devices, each C FLOP/s (matmul) and W bytes/s of collective bandwidth (ring bus
bandwidth: an all-reduce of s bytes takes 2 (N-1)/N s / W, an all-gather or reduce-scatter half that).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from worker.stats import positive

STRATEGIES = ("dp", "fsdp", "tp", "fsdp_tp")
# how a measured `ddp` cell's wrapper maps onto the planner's strategies
WRAPPER_STRATEGY = {"naive": "dp", "flat": "dp", "overlap": "dp", "bucketed": "dp", "torch_ddp": "dp",
                    "zero1": "zero1", "fsdp": "fsdp"}
SHARDING_STRATEGY = {"none": "dp", "zero1": "zero1", "fsdp": "fsdp"}  # the leaderboard suite's recipes


@dataclass(frozen=True)
class Model:
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = 10_000
    seq_len: int = 512

    @property
    def layer_params(self) -> int:
        return 4 * self.d_model**2 + 3 * self.d_model * self.d_ff  # norms' 2 D left out: < 0.1 %

    @property
    def params(self) -> int:
        return self.num_layers * self.layer_params + 2 * self.vocab_size * self.d_model


@dataclass(frozen=True)
class Cluster:
    devices: int
    memory_bytes: float
    flops: float  # C, FLOP/s per device
    bandwidth: float  # W, bytes/s per device
    overlap: bool = True  # communication overlaps computation (and, for FSDP+TP, the two axes each other)


@dataclass(frozen=True)
class Precision:
    param_bytes: int = 4  # fp32 weights (mixed precision keeps fp32 masters)
    grad_bytes: int = 4
    optim_bytes: int = 8  # AdamW: m and v in fp32
    act_bytes: int = 2  # bf16 activations
    comm_bytes: int = 4  # what the collectives carry per element (fp32 gradients)


def step_flops(m: Model, batch: int) -> dict[str, float]:
    """Forward FLOPs of the whole step (all devices): 2 per multiply-add.

    matmuls: 2 T (L (4 D^2 + 3 D F) + V D)  (the embedding is a lookup; the head is a matmul)
    attention scores and values: L * 2 * 2 T S D, halved by the causal mask
    backward = 2 x forward.
    """
    t = batch * m.seq_len
    matmul = 2 * t * (m.num_layers * m.layer_params + m.vocab_size * m.d_model)
    attention = m.num_layers * 2 * t * m.seq_len * m.d_model  # 4 T S D, halved (causal)
    fwd = matmul + attention
    return {"fwd": fwd, "bwd": 2 * fwd, "step": 3 * fwd}


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def comm_bytes(m: Model, batch: int, strategy: str, n_fsdp: int, n_tp: int, p: Precision) -> dict[str, float]:
    """Bytes each device sends per step (ring collectives), forward and backward.

    dp:   backward all-reduce of all gradients: 2 (N-1)/N P b
    fsdp: forward all-gather of weights (N-1)/N P b; backward the same again plus a reduce-scatter of
          gradients (N-1)/N P b
    tp:   per layer two all-reduces of activations (after attention's O and the FFN's W2) in forward,
          two in backward, each 2 (N-1)/N (T/N_fsdp) D b_act
    fsdp_tp: both, FSDP over the 1/N_tp weight shard, TP over the 1/N_fsdp token share
    """
    n = n_fsdp * n_tp
    tokens = batch * m.seq_len
    weights = m.params * p.comm_bytes
    fwd = bwd = 0.0
    axes = {"data": 0.0, "tensor": 0.0}  # bytes over the data-parallel and the tensor-parallel groups
    if strategy in ("dp", "zero1"):
        bwd += 2 * _ring(n) * weights
        axes["data"] += 2 * _ring(n) * weights
    if strategy == "zero1":  # each rank broadcasts the parameters it updated: (N-1)/N P b_param
        bwd += _ring(n) * m.params * p.param_bytes
        axes["data"] += _ring(n) * m.params * p.param_bytes
    if strategy in ("fsdp", "fsdp_tp"):
        shard = weights / (n_tp if strategy == "fsdp_tp" else 1)
        k = n_fsdp if strategy == "fsdp_tp" else n
        fwd += _ring(k) * shard
        bwd += 2 * _ring(k) * shard
        axes["data"] += 3 * _ring(k) * shard
    if strategy in ("tp", "fsdp_tp"):
        k = n_tp if strategy == "fsdp_tp" else n
        share = tokens / (n_fsdp if strategy == "fsdp_tp" else 1)
        per_layer = 2 * 2 * _ring(k) * share * m.d_model * p.act_bytes
        fwd += m.num_layers * per_layer
        bwd += m.num_layers * per_layer
        axes["tensor"] += 2 * m.num_layers * per_layer
    return {"fwd": fwd, "bwd": bwd, "step": fwd + bwd, **axes}


def memory(m: Model, batch: int, strategy: str, n_fsdp: int, n_tp: int, p: Precision,
           checkpointing: bool = False) -> dict[str, float]:
    """Bytes per device: parameters, gradients, optimizer state (divided by the devices that shard
    them), and activations saved for backward.

    Activations per layer without checkpointing, for T' tokens on a device and TP degree t
    (no sequence parallelism): T' D (10 + 24/t) b/2 + 5 H S T'/t (bytes at 2-byte activations),
    after Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
    (attention's softmax and mask terms dropped when FlashAttention recomputes them: the 5 H S T'/t
    term is left out here, since benchlab's models use SDPA or the Triton kernel).
    With checkpointing: each layer keeps its input (T' D b) plus one layer's full set during recompute.
    """
    n = n_fsdp * n_tp
    shard = {"dp": 1, "zero1": 1, "fsdp": n, "tp": n, "fsdp_tp": n}[strategy]
    tokens = batch * m.seq_len / {"dp": n, "zero1": n, "fsdp": n, "tp": 1, "fsdp_tp": n_fsdp}[strategy]
    t = {"dp": 1, "zero1": 1, "fsdp": 1, "tp": n, "fsdp_tp": n_tp}[strategy]
    per_layer = tokens * m.d_model * (10 + 24 / t) * p.act_bytes / 2
    residual = tokens * m.d_model * p.act_bytes
    acts = (m.num_layers * residual + per_layer) if checkpointing else m.num_layers * per_layer
    optim_shard = n if strategy == "zero1" else shard
    return {"params": m.params * p.param_bytes / shard, "grads": m.params * p.grad_bytes / shard,
            "optimizer_state": m.params * p.optim_bytes / optim_shard, "activations": acts}


def plan_one(m: Model, batch: int, c: Cluster, strategy: str, n_fsdp: int, n_tp: int, p: Precision,
             checkpointing: bool = False) -> dict:
    """Per-device FLOPs, bytes, times and memory of one layout; `comm_bound` when communication
    takes longer than computation."""
    n = n_fsdp * n_tp
    flops = {k: v / n for k, v in step_flops(m, batch).items()}
    if checkpointing:
        flops = {**flops, "bwd": flops["bwd"] + flops["fwd"], "step": flops["step"] + flops["fwd"]}
    sent = comm_bytes(m, batch, strategy, n_fsdp, n_tp, p)
    t_compute = flops["step"] / c.flops
    # the two axes of FSDP+TP use different groups of links and may run at once
    axes = (sent["data"] / c.bandwidth, sent["tensor"] / c.bandwidth)
    t_comm = max(axes) if c.overlap else sum(axes)
    step = max(t_compute, t_comm) if c.overlap else t_compute + t_comm
    mem = memory(m, batch, strategy, n_fsdp, n_tp, p, checkpointing)
    total = sum(mem.values())
    return {"strategy": strategy, "devices": n, "n_fsdp": n_fsdp, "n_tp": n_tp, "flops": flops, "comm_bytes": sent,
            "compute_s": t_compute, "comm_s": t_comm, "step_s": step, "comm_bound": t_comm > t_compute,
            "memory": mem, "memory_total": total, "fits": total <= c.memory_bytes}


def max_devices_before_comm_bound(m: Model, batch: int, c: Cluster, strategy: str, p: Precision,
                                  limit: int = 1 << 16) -> int | None:
    """The largest N (powers of two up to `limit`) at which `strategy` is not communication-bound;
    None when it is bound already at 2. FSDP+TP: the best split at each N."""
    best = None
    n = 2
    while n <= limit:
        if strategy == "fsdp_tp":
            ok = any(not plan_one(m, batch, c, strategy, n // t, t, p)["comm_bound"] for t in _divisors(n)
                     if 1 < t < n)
        else:
            layout = (n, 1) if strategy in ("dp", "fsdp") else (1, n)
            ok = not plan_one(m, batch, c, strategy, *layout, p)["comm_bound"]
        if ok:
            best = n
        n *= 2
    return best


def recipe_precision(par: dict, p: Precision = Precision()) -> tuple[Precision, str | None]:
    """The bytes per parameter a `leaderboard` recipe keeps on each GPU, and what its prediction leaves out.

    param_dtype=bf16: 2-byte weights and gradients (and collectives), with 4-byte fp32 masters beside
    the optimizer state; state_dtype=bf16: AdamW's m and v in 2 bytes each (4, not 8); offload: masters
    and state on the host (0 bytes on the GPU), and the optimizer step, run by the host's CPU, is not
    in the predicted step (so no step ratio is given).
    """
    bf16_weights = par.get("param_dtype") == "bf16"
    weight = 2 if bf16_weights else p.param_bytes
    state = 4 if par.get("state_dtype") == "bf16" else p.optim_bytes
    if par.get("offload"):
        optim, note = 0, "offload: the host's optimizer step is not predicted"
    else:
        optim, note = state + (4 if bf16_weights else 0), None
    return replace(p, param_bytes=weight, grad_bytes=weight, optim_bytes=optim,
                   comm_bytes=2 if bf16_weights else p.comm_bytes), note


def predict_measured(rows: list[dict], c: Cluster, p: Precision = Precision()) -> list[dict]:
    """Predicted step time and memory beside each finished GPU `ddp` or `leaderboard` cell (its model,
    batch and world size from its params and metrics; a leaderboard recipe's dtypes and offload from
    recipe_precision), with measured / predicted."""
    out = []
    for r in rows:
        try:
            row = _predicted(r, c, p)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            continue  # metrics not of the shape the ddp and leaderboard suites write (a hand-made file's)
        if row is not None:
            out.append(row)
    return out


def _predicted(r: dict, c: Cluster, p: Precision) -> dict | None:
    """predict_measured's row for one result row, or None for a row it does not predict."""
    met, par = r.get("metrics") or {}, r.get("params") or {}
    leaderboard = "sharding" in par
    recipe = par.get("sharding") if leaderboard else par.get("wrapper")
    strategy = (SHARDING_STRATEGY if leaderboard else WRAPPER_STRATEGY).get(recipe)
    model = met.get("model")
    if r.get("state") != "done" or strategy is None or not model or met.get("backend") != "nccl":
        return None
    m = Model(model["d_model"], model["d_ff"], model["num_layers"], model["num_heads"],
              model.get("vocab_size") or par.get("vocab_size", 10_000), model["context_length"])
    n = int(met.get("world_size") or par.get("world_size") or 1)
    batch = (par.get("batch", 1) if leaderboard else model["batch"]) * n  # the planner's batch is the step's
    overlap = leaderboard or par.get("wrapper") not in ("naive", "flat")
    checkpointing = leaderboard and par.get("checkpointing", "none") != "none"
    cell_p, note = recipe_precision(par, p) if leaderboard else (p, None)
    pred = plan_one(m, batch, Cluster(n, c.memory_bytes, c.flops, c.bandwidth, overlap=overlap),
                    strategy, n, 1, cell_p, checkpointing)
    step_ms, peak = positive(met.get("median_ms")), positive(met.get("peak_mem_bytes"))
    return {"job_id": r.get("job_id"), "wrapper": f"leaderboard {recipe}" if leaderboard else recipe,
            "world_size": n, "d_model": m.d_model, "num_layers": m.num_layers, "measured_step_ms": step_ms,
            "predicted_step_ms": pred["step_s"] * 1e3,
            "step_ratio": step_ms / (pred["step_s"] * 1e3) if step_ms and note is None else None,
            "measured_peak_bytes": peak, "predicted_memory_bytes": pred["memory_total"],
            "memory_ratio": peak / pred["memory_total"] if peak else None,
            "host_bound": met.get("host_bound"), "note": note}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan(m: Model, batch: int, c: Cluster, p: Precision = Precision(), checkpointing: bool = False) -> dict:
    """Every strategy on all `c.devices` devices (FSDP+TP: every split, the fastest that fits first)."""
    n = c.devices
    rows = [plan_one(m, batch, c, "dp", n, 1, p, checkpointing),
            plan_one(m, batch, c, "fsdp", n, 1, p, checkpointing),
            plan_one(m, batch, c, "tp", 1, n, p, checkpointing)]
    splits = [plan_one(m, batch, c, "fsdp_tp", n // t, t, p, checkpointing) for t in _divisors(n) if 1 < t < n]
    splits.sort(key=lambda r: (not r["fits"], r["step_s"]))
    return {"model": {**asdict(m), "params": m.params}, "batch": batch, "cluster": asdict(c),
            "precision": asdict(p), "checkpointing": checkpointing, "strategies": rows,
            "fsdp_tp_splits": splits, "best_split": splits[0] if splits else None,
            "max_devices_before_comm_bound": {s: max_devices_before_comm_bound(m, batch, c, s, p)
                                              for s in STRATEGIES},
            "tokens": batch * m.seq_len}
