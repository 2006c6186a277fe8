"""Distributed wrappers: DDP four ways, ZeRO-1 sharded optimizer, FSDP, and rank launching.

Each wrapper is applied to a plain nn.Module from outside; the model knows nothing of them.
"""
