"""Adaptors that run peer codes' published models on our test sets (n2p2, metatrain)."""
