"""The data: folder (which files, which labels, which split), decode (crop, resize, the Dataset), prepared (a
packed copy for speed) and splits (open either)."""
