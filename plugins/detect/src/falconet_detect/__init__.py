"""falconet plugin: the YOLO family and its label assigners. Torch is imported only when a
model is built, so listing plugins stays fast."""
