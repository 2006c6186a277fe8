"""The compute under test: attention implementations and the Transformer LM built on them."""
