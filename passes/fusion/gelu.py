"""(being written by H8)."""
