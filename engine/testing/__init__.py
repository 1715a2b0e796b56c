"""Test helpers: tiny random Qwen3.5 checkpoints and reference runners."""
