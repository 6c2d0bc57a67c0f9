"""Algorithms beyond plain MAML: MACAW's losses and settings."""
