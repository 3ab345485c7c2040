"""The runner: reads the contract, fetches input, calls the model, stores predictions."""
