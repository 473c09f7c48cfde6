"""What the benchmark suites share: number formatting, JSONL records, page footers and rerun
commands, CSV tables beside the pages, test-set evaluation of a potential, the force-uncertainty
frames and their scoring (:mod:`~benchmarks.common.force_frames`), and the peers that several
suites run (mace-torch trained by its CLI, the n2p2 NNP evaluator)."""
