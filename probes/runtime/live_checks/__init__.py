"""Checks that read the run live, as it trains: structure and wiring, the loss contract,
torch's own warnings."""
