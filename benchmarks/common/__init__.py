"""What the benchmark suites share: number formatting, JSONL records, page footers and rerun
commands, CSV tables beside the pages, test-set evaluation of a potential, and the peers that
several suites run (mace-torch trained by its CLI, the n2p2 NNP evaluator)."""
