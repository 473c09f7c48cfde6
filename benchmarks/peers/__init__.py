"""Peer rows on the suites' frames: mace-torch users (``mace_rows``) and metatrain's PET
(``metatrain``); the pieces they share with the suites are in :mod:`benchmarks.common`."""
