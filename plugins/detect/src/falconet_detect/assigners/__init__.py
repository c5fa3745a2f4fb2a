"""Label assigners: standalone no-grad functions of (predictions, padded targets)."""
