"""The trainer: configuration, the loop, checkpoints, validation, callbacks."""
